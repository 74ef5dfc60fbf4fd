"""`engine_model --gemma3`: Gemma 3 270M in the engine against transformers' reference logits
(tests/data/gemma3_reference.json).

    .venv/bin/python -m bench.engine_model --gemma3 --formats fp32   # → bench/results/gemma3_check_fp32.json

Prints, per reference prompt, argmax agreement and the largest difference on the reference's top-5
logits; the long prompt (past the 512-token sliding window) runs in 160-token prefill chunks, then 8
decode steps, through the paged KV cache.
"""

import json
import time
from pathlib import Path

import torch

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.model_runner import ModelRunner
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence
from bench.lib.routellm_data import RESULTS

REFERENCE = Path(__file__).resolve().parents[2] / "tests" / "data" / "gemma3_reference.json"


def run_chunks(runner: ModelRunner, ids: list[int], chunks: list[int], first: int = 0) -> torch.Tensor:
    """Logits of positions first.. (earlier ones are not projected on the 262k vocabulary), computing
    the sequence in the given chunk sizes (1 = decode steps)."""
    table = list(range(-(-len(ids) // runner.block_size)))
    rows, done = [], 0
    for size in chunks:
        seq = Sequence(ids[: done + size])
        seq.block_table, seq.num_computed_tokens = table, done
        wanted = done + size - max(first, done)
        (out,) = runner.execute([ScheduledSeq(seq, size, num_logits=max(wanted, 1))])
        if wanted > 0:
            rows.append(out.logits)
        done += size
    return torch.cat(rows)


def chunking(length: int, prefill: int = 160, decode: int = 8) -> list[int]:
    head = length - decode
    return [c for c in [prefill] * (head // prefill) + [head % prefill] + [1] * decode if c]


def compare(logits: torch.Tensor, case: dict) -> dict:
    top_ids = torch.tensor(case["top_ids"])
    ours = logits[-len(top_ids) :]
    agree = (ours.argmax(-1) == top_ids[:, 0]).float().mean().item()
    diff = (ours.gather(1, top_ids) - torch.tensor(case["top_logits"])).abs()
    return {"positions": len(top_ids), "argmax_agreement": agree, "max_top5_logit_diff": round(diff.max().item(), 5),
            "mean_top5_logit_diff": round(diff.mean().item(), 5)}  # fmt: skip


def check(dtype: str) -> None:
    """Every reference prompt in the engine at `dtype`, printed and written to gemma3_check_<dtype>.json."""
    reference = json.loads(REFERENCE.read_text())
    runner = ModelRunner(EngineSettings(model=Path("gemma3-270m"), dtype=dtype, kv_cache_memory_mb=64,
                                        num_threads=2))  # fmt: skip
    results = {}
    for name, case in reference["cases"].items():
        start = time.perf_counter()
        tokens_match = runner.tokenizer.encode(case["text"]) == case["ids"]
        chunks = chunking(len(case["ids"])) if name == "long" else [len(case["ids"])]
        results[name] = {"tokens": len(case["ids"]), "token_ids_match": tokens_match,
                         **compare(run_chunks(runner, case["ids"], chunks, case["first_position"]), case),
                         "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
        print(name, json.dumps(results[name]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"gemma3_check_{dtype}.json").write_text(json.dumps(results, indent=2))
