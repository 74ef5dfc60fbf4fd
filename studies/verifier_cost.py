"""The verifier's in-process cost per candidate, on the same pairs in either tree (A/B by PYTHONPATH):
the questions of bench/cache_latency.py encoded as the gateway encodes them, every question's word
tables made beforehand (as for stored questions and, since semspeed, for the new one during its forward
pass), then 2,000 random (stored, new) pairs judged one candidate at a time (`judge_all`: features, trees,
exact rules) and their features alone. studies/cache_profile.py times whole lookups, but its p50 depends on
how many candidates the index proposes, which the encoder's text normalisation changes.

    python -m studies.verifier_cost [--name NAME]     # prints p50 / p99 ms per candidate
"""

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.cache_latency import questions
from bench.lib.verifier_pairs import shipped_encoder
from cache.alignment import pair_features, words_of
from cache.verifier import Verifier


def _per_call_ms(
    fn: Callable[[Any, Any], object], pairs: list[tuple[Any, Any]], warmup: int = 200
) -> np.ndarray:
    times = []
    for stored, new in pairs:
        start = time.perf_counter()
        fn(stored, new)
        times.append(time.perf_counter() - start)
    return np.array(times[warmup:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    stored_texts, asked_texts = questions()
    encoder = shipped_encoder()
    stored = encoder.encode(stored_texts[:200])
    asked = [encoder.encode([q])[0] for q in asked_texts[:200]]
    for q in stored + asked:
        words_of(q.text, q.words)
    verifier = Verifier.load()
    rng = np.random.default_rng(0)
    pairs = [(stored[i], asked[j]) for i, j in rng.integers(0, 200, size=(2000, 2))]
    parts: dict[str, Callable[[Any, Any], object]] = {
        "judge_all, 1 candidate": lambda s, a: verifier.judge_all([s], a, 0.5),
        "pair_features": pair_features,
    }
    for part, fn in parts.items():
        ms = _per_call_ms(fn, pairs)
        print(
            f"{args.name or sys.path[0]} {part:24} p50 {np.percentile(ms, 50):.4f} ms  p99 {np.percentile(ms, 99):.4f} ms"
        )


if __name__ == "__main__":
    main()
