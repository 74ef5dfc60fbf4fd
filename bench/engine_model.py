"""Engine model benchmark: prefill and batch-1 decode tok/s per weight format next to HF transformers.

Runs every system in the same process, alternating them run by run; also times the attention layouts
(decode: one SDPA over the padded batch with query-head groups; per-sequence gather + SDPA; padded SDPA) and, if tests/data/quality_text.txt exists, the
perplexity and greedy agreement of each format against fp32. Prints tables, writes
bench/results/engine_model.json.

    .venv/bin/python -m bench.engine_model [--formats fp32,bf16,int8,int4] [--threads 1,2] [--repeats 3]
    .venv/bin/python -m bench.engine_model --gemma3 --formats fp32   # Gemma 3 270M's logits beside transformers'

--gemma3 checks Gemma 3 270M instead, per format, against transformers' reference logits
(tests/data/gemma3_reference.json; bench/lib/gemma3_check.py): argmax agreement and the largest top-5 logit
difference per prompt, written to bench/results/gemma3_check_<format>.json.
"""

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from backends.local_engine.config import EngineSettings  # noqa: E402
from backends.local_engine.engine.model_runner import ModelRunner  # noqa: E402
from backends.local_engine.engine.quality import argmax_agreement, perplexity, teacher_forced_logits  # noqa: E402
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence  # noqa: E402
from backends.local_engine.loading.gguf import packaged_model_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUALITY_TEXT = ROOT / "tests" / "data" / "quality_text.txt"


def prompt_ids(runner: ModelRunner, length: int) -> list[int]:
    text = "The history of the printing press is a story of ideas, metal and ink. " * 100
    return runner.tokenizer.encode(text, add_special_tokens=False)[:length]


def engine_generate(runner: ModelRunner, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds for new_tokens - 1 single-token steps), greedy, batch 1."""
    seq = Sequence(list(prompt), block_table=list(range(runner.num_blocks)))
    start = time.perf_counter()
    logits = runner.execute([ScheduledSeq(seq, len(prompt))])[0].logits
    prefill = time.perf_counter() - start
    for _ in range(new_tokens - 1):
        seq.num_computed_tokens = len(seq.token_ids)
        seq.append_token(int(logits[-1].argmax()))
        logits = runner.execute([ScheduledSeq(seq, 1)])[0].logits
    return prefill, time.perf_counter() - start - prefill


class TokenClock:
    """A generate() streamer that records when each put() arrives (the prompt first, then each new token)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_generate(model, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    """(prefill seconds up to the first new token, seconds for the other new_tokens - 1), one generate()."""
    clock = TokenClock()
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(
            torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
            use_cache=True, streamer=clock,
        )  # fmt: skip
    first_token = clock.times[1]
    return first_token - start, clock.times[-1] - first_token


def load_hf():
    from transformers import AutoModelForCausalLM

    path = packaged_model_path()
    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


def speed_table(systems: dict[str, Callable], args: argparse.Namespace) -> list[dict]:
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in systems}
        for _ in range(args.repeats):
            for name, run in systems.items():  # alternate systems run by run
                samples[name].append(run())
        for name, runs in samples.items():
            prefill = statistics.median(r[0] for r in runs)
            decode = statistics.median(r[1] for r in runs)
            rows.append(
                {
                    "system": name,
                    "threads": threads,
                    "prefill_tok_s": args.prompt_tokens / prefill,
                    "decode_tok_s": (args.new_tokens - 1) / decode,
                }
            )
    return with_ratio_to_hf(rows)


def with_ratio_to_hf(rows: list[dict]) -> list[dict]:
    """Adds decode_vs_hf: decode tok/s over HF generate's at the same thread count."""
    hf = {row["threads"]: row["decode_tok_s"] for row in rows if row["system"].startswith("hf_")}
    for row in rows:
        if row["threads"] in hf:
            row["decode_vs_hf"] = row["decode_tok_s"] / hf[row["threads"]]
    return rows


def attention_table(runner: ModelRunner, args: argparse.Namespace) -> list[dict]:
    """Decode step time for B sequences of context C, per attention layout."""
    torch.set_num_threads(args.threads[0])
    rows = []
    for batch, context in [(1, 256), (1, 1024), (8, 256), (32, 128)]:
        for layout in ("auto", "per_seq", "padded"):  # auto = the decode layout for decode-only steps
            runner.attention_layout = layout
            seqs = [Sequence(prompt_ids(runner, context)) for _ in range(batch)]
            per_seq_blocks = -(-context // runner.block_size)
            for i, seq in enumerate(seqs):
                seq.block_table = list(range(i * per_seq_blocks, (i + 1) * per_seq_blocks))
                seq.num_computed_tokens = context - 1
            step = [ScheduledSeq(seq, 1) for seq in seqs]
            runner.execute(step)
            start = time.perf_counter()
            for _ in range(args.repeats * 3):
                runner.execute(step)
            ms = (time.perf_counter() - start) / (args.repeats * 3) * 1e3
            rows.append({"batch": batch, "context": context, "layout": layout, "step_ms": ms})
    runner.attention_layout = "auto"
    return rows


def quality_table(runners: dict[str, ModelRunner], max_tokens: int) -> list[dict]:
    if not QUALITY_TEXT.exists():
        return []
    reference = runners["fp32"]
    ids = reference.tokenizer.encode(QUALITY_TEXT.read_text(), add_special_tokens=False)[:max_tokens]
    base = teacher_forced_logits(reference, ids)
    rows = []
    for name, runner in runners.items():
        logits = base if runner is reference else teacher_forced_logits(runner, ids)
        rows.append(
            {
                "format": name,
                "tokens": len(ids),
                "ppl": perplexity(logits, ids),
                "agreement": argmax_agreement(logits, base),
            }
        )
    return rows


def print_table(title: str, rows: list[dict]) -> None:
    if not rows:
        return
    print(f"\n{title}")
    keys = list(rows[0])
    print(" | ".join(f"{k:>14}" for k in keys))
    for row in rows:
        print(" | ".join(f"{v:>14.3f}" if isinstance(v, float) else f"{v!s:>14}" for v in row.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="fp32,bf16,int8,int4")
    parser.add_argument("--threads", default="1,2", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=33)
    parser.add_argument("--quality-tokens", type=int, default=1024)
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument(
        "--gemma3", action="store_true", help="Gemma 3 270M's logits vs the reference instead"
    )
    args = parser.parse_args()
    if args.gemma3:
        from bench.lib.gemma3_check import check

        for fmt in args.formats.split(","):
            check(fmt)
        return

    runners = {
        fmt: ModelRunner(EngineSettings(dtype=fmt, kv_cache_memory_mb=256, max_model_len=4096))
        for fmt in args.formats.split(",")
    }
    first = next(iter(runners.values()))
    prompt = prompt_ids(first, args.prompt_tokens)
    systems: dict[str, Callable] = {}
    if not args.no_hf:
        hf_model = load_hf()
        systems["hf_fp32_generate"] = lambda: hf_generate(hf_model, prompt, args.new_tokens)
    for fmt, runner in runners.items():
        systems[f"engine_{fmt}"] = lambda runner=runner: engine_generate(runner, prompt, args.new_tokens)

    memory = [
        {"format": fmt, "weight_MB": r.weight_bytes / 2**20, "kv_bytes_per_token": r.kv_bytes_per_token}
        for fmt, r in runners.items()
    ]
    speed = speed_table(systems, args)
    attention = attention_table(runners.get("fp32", first), args)
    quality = quality_table(runners, args.quality_tokens) if "fp32" in runners else []
    print_table("Memory per format", memory)
    print_table(
        f"Speed (prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens, median of {args.repeats})",
        speed,
    )
    print_table("Attention layouts (one decode step, fp32)", attention)
    print_table("Quality vs fp32 (teacher-forced on tests/data/quality_text.txt)", quality)
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    payload = {
        "args": vars(args),
        "memory": memory,
        "speed": speed,
        "attention": attention,
        "quality": quality,
    }
    (results / "engine_model.json").write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
