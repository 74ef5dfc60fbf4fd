"""Decode-speed cost of structured outputs (grammar-constrained decoding with llguidance) in our engine.

Generates the same number of tokens greedily with and without a json_schema response format (a schema
with one long free-text field, so both runs decode `--tokens` tokens) and reports decode tokens/s and
the time spent computing grammar masks per token.

    .venv/bin/python -m bench.engine_structured [--tokens 96] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from backends.local_engine.config import EngineSettings  # noqa: E402
from backends.local_engine.engine import structured  # noqa: E402
from backends.local_engine.engine.detokenizer import IncrementalDetokenizer  # noqa: E402
from backends.local_engine.engine.llm_engine import LLMEngine  # noqa: E402
from backends.local_engine.engine.model_runner import ModelRunner  # noqa: E402
from backends.local_engine.engine.sampler import probabilities  # noqa: E402
from backends.local_engine.server.protocol import sampling_params  # noqa: E402
from bench.lib.harness import RESULTS  # noqa: E402

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
          "required": ["title", "story"]}  # fmt: skip
MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper, as JSON."}]


def decode(
    runner: ModelRunner, grammars: structured.Grammars, tokens: int, constrained: bool
) -> tuple[float, int]:
    engine = LLMEngine(EngineSettings(max_model_len=512), runner, probabilities,
                       lambda p, params: IncrementalDetokenizer(runner.tokenizer, p, params))  # fmt: skip
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": tokens, "ignore_eos": True}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    engine.add_request(
        runner.tokenizer.encode_chat(MESSAGES), sampling_params("chat", body, tokens, grammars)
    )
    engine.step()  # prefill (and the first token) is not decode
    produced, start = 0, time.perf_counter()
    while engine.has_work:
        produced += sum(len(out.new_token_ids) for out in engine.step())
    return produced / (time.perf_counter() - start), produced


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runner = ModelRunner(EngineSettings(kv_cache_memory_mb=64, max_model_len=512))
    grammars = structured.grammars_for(runner.tokenizer)
    grammars.tokenizer()  # built once per engine (~2 s); not part of decoding
    mask_time = [0.0, 0]
    original = structured.JsonConstraint.mask

    def timed_mask(self: structured.JsonConstraint, logits, output_ids) -> None:  # noqa: ANN001
        start = time.perf_counter()
        original(self, logits, output_ids)
        mask_time[0] += time.perf_counter() - start
        mask_time[1] += 1

    structured.JsonConstraint.mask = timed_mask
    rates: dict[str, list[float]] = {"free": [], "json_schema": []}
    for _ in range(args.rounds):  # alternate, so load changes hit both alike
        for name in rates:
            rates[name].append(decode(runner, grammars, args.tokens, name == "json_schema")[0])
    free, constrained = statistics.median(rates["free"]), statistics.median(rates["json_schema"])
    per_mask_us = mask_time[0] / max(mask_time[1], 1) * 1e6
    print(f"{'mode':<12} {'decode tok/s':>12}")
    print(f"{'free':<12} {free:>12.1f}\n{'json_schema':<12} {constrained:>12.1f}")
    print(f"cost: {100 * (1 - constrained / free):.1f} % of decode speed; mask {per_mask_us:.0f} µs/token "
          f"(load {os.getloadavg()[0]:.1f})")  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {"free_tok_s": rates["free"], "json_schema_tok_s": rates["json_schema"], "mask_us": per_mask_us,
               "tokens": args.tokens, "load": os.getloadavg()[0]}  # fmt: skip
    (RESULTS / "engine_structured.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
