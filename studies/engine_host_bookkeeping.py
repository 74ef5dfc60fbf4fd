"""Host time of a decode step's scheduling and block bookkeeping at 256 running sequences (issue 45), no GPU.

    PYTHONPATH=/tmp/before .venv/bin/python studies/engine_host_bookkeeping.py before   # a copy of the old tree
    .venv/bin/python studies/engine_host_bookkeeping.py after

256 sequences of 128-2,048 prompt tokens are admitted and prefilled (no model: the computed counts advance),
then 300 decode steps are timed: schedule(), then per sequence the count advance, cache_full_blocks and the
appended token, as the engine does after a step. Prints the median and minimum ms per step.
"""

import random
import sys
import time

from backends.local_engine.engine.block_manager import BlockManager
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.scheduler import Scheduler
from backends.local_engine.engine.sequence import Sequence


def main(label: str) -> None:
    rng = random.Random(0)
    blocks = BlockManager(40000, 16)
    scheduler = Scheduler(blocks, 2048, 256)
    for _ in range(256):
        prompt = [rng.randrange(1000) for _ in range(rng.randint(128, 2048))]
        scheduler.add(Sequence(prompt, SamplingParams(max_tokens=600)))
    while scheduler.waiting or any(s.num_uncomputed_tokens > 1 for s in scheduler.running):
        for item in scheduler.schedule().scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            blocks.cache_full_blocks(item.seq)
            if item.seq.num_computed_tokens == len(item.seq):
                item.seq.append_token(5)
    times = []
    for _ in range(300):
        start = time.perf_counter()
        for item in scheduler.schedule().scheduled:
            item.seq.num_computed_tokens += 1
            blocks.cache_full_blocks(item.seq)
            item.seq.append_token(7)
        times.append((time.perf_counter() - start) * 1e3)
    print(f"{label}: schedule + bookkeeping ms/step p50 {sorted(times)[150]:.3f}, min {min(times):.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "this tree")
