"""Step cost on this CPU, to pick max_num_batched_tokens and max_num_seqs by measurement.

Times `ModelRunner.execute` for prefill chunks of N tokens and for decode batches of B sequences (each
with 256 tokens of context), and prints tokens/s. A budget is good once a bigger chunk stops buying
prefill throughput (it only lengthens the step that decodes wait for); max_num_seqs likewise where
decode throughput stops growing.

    .venv/bin/python -m studies.engine_budget [--threads 1] [--dtype int8]
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from backends.local_engine.config import EngineSettings  # noqa: E402
from backends.local_engine.engine.model_runner import ModelRunner  # noqa: E402
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence  # noqa: E402
from studies import RESULTS  # noqa: E402

CONTEXT = 256


def timed(runner: ModelRunner, batch: list[ScheduledSeq], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.execute(batch)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def prefill_batch(runner: ModelRunner, num_tokens: int) -> list[ScheduledSeq]:
    seq = Sequence([1000 + i % 3000 for i in range(num_tokens)])
    seq.block_table = list(range(-(-num_tokens // runner.block_size)))
    return [ScheduledSeq(seq, num_tokens)]


def decode_batch(runner: ModelRunner, num_seqs: int) -> list[ScheduledSeq]:
    blocks_each = -(-(CONTEXT + 1) // runner.block_size)
    batch = []
    for index in range(num_seqs):
        seq = Sequence([1000 + (index * 7 + i) % 3000 for i in range(CONTEXT + 1)])
        seq.block_table = list(range(index * blocks_each, (index + 1) * blocks_each))
        seq.num_computed_tokens = CONTEXT
        batch.append(ScheduledSeq(seq, 1))
    return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="int8")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runner = ModelRunner(EngineSettings(num_threads=args.threads, dtype=args.dtype, kv_cache_memory_mb=512))
    rows = []
    print(f"{'kind':>8} {'size':>5} {'step ms':>8} {'tok/s':>8}")
    for kind, sizes, make in (
        ("prefill", [16, 32, 64, 128, 256, 512, 1024], prefill_batch),
        ("decode", [1, 2, 4, 8, 16, 32, 64], decode_batch),
    ):
        for size in sizes:
            if kind == "decode" and size * (CONTEXT + 1) > runner.num_blocks * runner.block_size:
                continue  # does not fit the KV pool
            seconds = timed(runner, make(runner, size), args.repeats)
            rows.append({"kind": kind, "size": size, "step_ms": seconds * 1000, "tok_s": size / seconds})
            print(f"{kind:>8} {size:>5} {seconds * 1000:>8.1f} {size / seconds:>8.1f}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "engine_budget.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
