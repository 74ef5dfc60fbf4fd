"""bench/semantic_cache_eval.py: a cross-encoder verifier folder is scored by its pair probabilities (stored
question first, one pair per lookup, as the cache asks it), not by the trees' features it does not have; and
each --pairs file keeps its own name."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from bench.lib.verifier_pairs import encode_all, shipped_encoder  # noqa: E402
from bench.semantic_cache_eval import decisions  # noqa: E402
from cache.config import CachePolicy  # noqa: E402
from cache.encoder import EncodedQuestion  # noqa: E402

ROWS = [
    {"a": "what is the capital of france", "b": "which city is the capital of france"},
    {"a": "how do i boil an egg", "b": "how long do i boil an egg for"},
    {"a": "how old is the eiffel tower", "b": "how tall is the eiffel tower"},
]


class FakeCross:
    """A cross-encoder verifier: probabilities per (stored, new) pair, threshold 0.9 at any target."""

    cross = object()

    def __init__(self, probability: dict[tuple[str, str], float]) -> None:
        self.probability = probability
        self.asked: list[tuple[str, str]] = []

    def scores(self, stored: list[EncodedQuestion], new: EncodedQuestion) -> np.ndarray:
        assert len(stored) == 1  # one candidate per call, as a lookup with one candidate
        self.asked.append((stored[0].text, new.text))
        return np.array([self.probability[(stored[0].text, new.text)]])

    def threshold_for(self, target: float) -> float:
        return 0.9


def test_a_cross_encoder_is_asked_each_pair_in_the_stored_then_new_order() -> None:
    encoded = encode_all(shipped_encoder(True), [t for r in ROWS for t in (r["a"], r["b"])])
    texts = [(encoded[r["a"]].text, encoded[r["b"]].text) for r in ROWS]
    verifier = FakeCross({texts[0]: 0.95, texts[1]: 0.5, texts[2]: 0.99})
    hits = decisions(ROWS, encoded, verifier, CachePolicy(), prefix="x:")  # type: ignore[arg-type]
    assert verifier.asked[: len(ROWS)] == texts
    cosine_ok = [float(encoded[r["a"]].vector @ encoded[r["b"]].vector) >= 0.6 for r in ROWS]
    assert hits["x:verifier"].tolist() == [cosine_ok[0], False, cosine_ok[2]]


def test_a_pairs_file_is_named_by_its_folder_and_any_other_file_by_its_stem() -> None:
    from bench.semantic_cache_eval import set_name

    assert set_name(Path("bench/data/indep_questions2/pairs.jsonl")) == "indep_questions2"
    assert {set_name(Path("/tmp/comqa.jsonl")), set_name(Path("/tmp/hand.jsonl"))} == {"comqa", "hand"}


def test_agreement_serves_only_where_both_verifiers_serve_at_the_same_target() -> None:
    from bench.semantic_cache_eval import agreement

    hits = {
        "verifier": np.array([True, True, False]),
        "verifier@0.95": np.array([True, True, True]),
        "cosine": np.array([True, True, True]),
        "x:verifier": np.array([True, False, True]),
        "x:verifier@0.95": np.array([False, True, True]),
    }
    found = agreement(hits, ["x:"])
    assert set(found) == {"x:verifier∧model", "x:verifier@0.95∧model"}  # no baseline, no cross-prefix pairs
    assert found["x:verifier∧model"].tolist() == [True, False, False]
    assert found["x:verifier@0.95∧model"].tolist() == [False, True, True]
