"""training/train_cross_verifier.py's length-bucketed batches: each whole batch of rows once per epoch, full
batches only, and far less padding than batches of random rows."""

import random

from training.train_cross_verifier import length_buckets


def padded(batches: list[list[dict]]) -> int:
    return sum(len(b) * max(len(r["a"]) + len(r["b"]) for r in b) for b in batches)


def test_every_row_once_in_full_batches_with_less_padding() -> None:
    rng = random.Random(1)
    rows = [
        {"a": "x" * rng.randint(5, 40), "b": "y" * rng.choice([5, 10, 200]), "id": i} for i in range(6_430)
    ]
    batches = length_buckets(rows, 64, random.Random(0))
    assert all(len(b) == 64 for b in batches) and len(batches) == 6_430 // 64
    ids = [r["id"] for b in batches for r in b]
    assert len(set(ids)) == len(ids) == 6_400
    shuffled = rows[:6_400]
    random.Random(0).shuffle(shuffled)
    plain = [shuffled[i : i + 64] for i in range(0, 6_400, 64)]
    assert padded(batches) < 0.6 * padded(plain)
    assert length_buckets(rows, 64, random.Random(0)) == batches  # seeded
    assert length_buckets(rows, 64, random.Random(2)) != batches
