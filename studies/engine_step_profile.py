"""Where an in-process decode step goes: wall time per step at 1-32 rows, and a torch.profiler op table.

    .venv/bin/python -m studies.engine_step_profile [--dtype fp16] [--threads 1] [--rows 1,4,16,32] [--profile 1]

Each row is one sequence at context ~160 decoding one token per step (the engine's ModelRunner.execute,
greedy argmax outside the timing). Prints ms per step and tok/s per row count, then (for --profile rows)
the top ops by self CPU time; writes studies/results/engine_step_profile_<dtype>_t<threads>.json.
"""

import argparse
import json
import os
import statistics
import time

import torch

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.model_runner import ModelRunner
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence
from studies import RESULTS

CONTEXT = 160


def decode_batch(runner: ModelRunner, rows: int) -> list[Sequence]:
    """`rows` sequences prefilled to CONTEXT tokens, each owning its own blocks."""
    per_seq = -(-(CONTEXT + 48) // runner.block_size)
    seqs = []
    for row in range(rows):
        ids = [(row * 7919 + i * 31) % 40000 + 100 for i in range(CONTEXT)]
        seq = Sequence(ids, block_table=list(range(row * per_seq, (row + 1) * per_seq)))
        logits = runner.execute([ScheduledSeq(seq, CONTEXT)])[0].logits
        seq.num_computed_tokens = CONTEXT
        seq.append_token(int(logits[-1].argmax()))
        seqs.append(seq)
    return seqs


def step(runner: ModelRunner, seqs: list[Sequence]) -> None:
    outputs = runner.execute([ScheduledSeq(seq, 1) for seq in seqs])
    for seq, out in zip(seqs, outputs, strict=True):
        seq.num_computed_tokens = len(seq.token_ids)
        seq.append_token(int(out.logits[-1].argmax()))


def time_steps(runner: ModelRunner, rows: int, steps: int) -> float:
    seqs = decode_batch(runner, rows)
    step(runner, seqs)
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        step(runner, seqs)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def profile_table(runner: ModelRunner, rows: int, steps: int = 10) -> str:
    seqs = decode_batch(runner, rows)
    step(runner, seqs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step(runner, seqs)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,4,16,32")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument(
        "--single-thread-max-tokens", type=int, default=EngineSettings().single_thread_max_tokens
    )
    parser.add_argument("--profile", default="1", help="row counts to profile (comma-separated, '' for none)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bf16", "fp32"])
    parser.add_argument(
        "--out", default=None, help="JSON file (default: engine_step_profile_<dtype>_t<threads>)"
    )
    args = parser.parse_args()
    settings = EngineSettings(
        dtype=args.dtype, num_threads=args.threads, kv_cache_memory_mb=512,
        single_thread_max_tokens=args.single_thread_max_tokens, kv_cache_dtype=args.kv_cache_dtype,
    )  # fmt: skip
    runner = ModelRunner(settings)
    results = []
    for rows in [int(r) for r in args.rows.split(",")]:
        ms = time_steps(runner, rows, args.steps)
        load = os.getloadavg()[0]
        results.append({"rows": rows, "step_ms": ms, "tok_s": rows * 1000 / ms, "load": load})
        print(f"{args.dtype} t{args.threads} rows {rows:>2}: {ms:7.1f} ms/step {rows * 1000 / ms:7.1f} tok/s "
              f"(load {load:.2f})", flush=True)  # fmt: skip
    for rows in [int(r) for r in args.profile.split(",") if r]:
        print(f"--- profile, {rows} rows ---\n{profile_table(runner, rows)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / (args.out or f"engine_step_profile_{args.dtype}_t{args.threads}.json")
    out.write_text(json.dumps({"dtype": args.dtype, "threads": args.threads, "kv_cache_dtype": args.kv_cache_dtype,
                               "results": results}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
