"""The shipped verifier on a fixed sample (written for this test, not drawn from any training template):
it accepts paraphrases and rejects each kind of look-alike at the default precision target; it fails
closed when its weights are missing; features are symmetric."""

import shutil

import numpy as np
import pytest

from cache.alignment import FEATURES, pair_features
from cache.config import CachePolicy
from cache.encoder import QuestionEncoder, build_encoder
from cache.verifier import MODEL_DIR, Verifier, load_verifier

PARAPHRASES = [
    ("What is the capital of France?", "Which city is the capital of France?"),
    ("How tall is the Eiffel Tower?", "What is the height of the Eiffel Tower?"),
    ("How do I reverse a list in Python?", "How can I reverse a Python list?"),
    ("Who wrote Pride and Prejudice?", "Who is the author of Pride and Prejudice?"),
    ("What are the symptoms of the flu?", "What are the signs of influenza?"),
]
NEGATIVES = {
    "scope": ("What is the capital of France?", "What was the capital of France in the Middle Ages?"),
    "language": ("What is the capital of France?", "What is the capital of France? Answer in French."),
    "format": ("List the planets of the solar system.", "List the planets of the solar system as JSON."),
    "audience": ("How does a rainbow form?", "How does a rainbow form? Explain it to a five-year-old."),
    "length": ("Why is the sky blue?", "Why is the sky blue? Answer in one word."),
    "intent": ("What is the capital of Norway?", "What currency is used in Norway?"),
    "entity": ("What is the capital of France?", "What is the capital of Germany?"),
    "unit": ("How tall is Mount Everest in meters?", "How tall is Mount Everest in feet?"),
    "swap": ("Is Paris larger than London?", "Is London larger than Paris?"),
    "negation": ("Which foods contain gluten?", "Which foods do not contain gluten?"),
    "number": ("What is 15% of 80?", "What is 25% of 80?"),
    "unrelated": ("What is the capital of France?", "How do I bake sourdough bread?"),
}


@pytest.fixture(scope="module")
def encoder() -> QuestionEncoder:
    return build_encoder(None, threads=1, onnx=False)


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    loaded = load_verifier()
    assert loaded is not None, "the verifier weights ship in cache/verifier_model/"
    return loaded


def judge(encoder: QuestionEncoder, verifier: Verifier, a: str, b: str) -> tuple[bool, float]:
    stored, new = encoder.encode([a, b])
    cosine = float(stored.vector @ new.vector)
    policy = CachePolicy()
    verdict = verifier.judge(stored, new, verifier.threshold_for(policy.semantic_min_precision))
    return cosine >= policy.similarity_threshold and verdict.accepted, verdict.probability


@pytest.mark.parametrize(("a", "b"), PARAPHRASES)
def test_paraphrases_are_accepted(encoder, verifier, a, b):
    accepted, probability = judge(encoder, verifier, a, b)
    assert accepted, f"{a!r} / {b!r}: p={probability:.3f}"


@pytest.mark.parametrize("kind", sorted(NEGATIVES))
def test_each_kind_of_look_alike_is_rejected(encoder, verifier, kind):
    a, b = NEGATIVES[kind]
    accepted, probability = judge(encoder, verifier, a, b)
    assert not accepted, f"{kind}: {a!r} / {b!r}: p={probability:.3f}"


def test_features_are_symmetric(encoder):
    a, b = encoder.encode(["Is Paris larger than London?", "Is London, by area, larger than Paris?"])
    assert pair_features(a, b).shape == (len(FEATURES),)
    assert np.allclose(pair_features(a, b), pair_features(b, a), atol=1e-5)


def test_a_stricter_target_never_lowers_the_threshold(verifier):
    thresholds = [verifier.threshold_for(p) for p in (0.9, 0.95, 0.98, 0.99, 1.0)]
    assert thresholds == sorted(thresholds)
    assert verifier.threshold_for(1.01) > 1.0  # unreachable: nothing passes


def test_missing_or_mismatched_weights_give_no_verifier(tmp_path):
    assert load_verifier(tmp_path) is None
    shutil.copytree(MODEL_DIR, tmp_path / "model")
    meta = tmp_path / "model" / "verifier.json"
    meta.write_text(meta.read_text().replace('"cosine"', '"another_feature"', 1))
    assert load_verifier(tmp_path / "model") is None
