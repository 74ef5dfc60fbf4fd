"""The shipped verifier on a fixed sample (written for this test, not drawn from any training template):
it accepts paraphrases and rejects each kind of look-alike at the default precision target; it fails
closed when its weights are missing; features are symmetric; the trees run in ONNX Runtime give what the
shipped arrays say."""

import json
import shutil

import numpy as np
import pytest

from cache.alignment import FEATURES, pair_features
from cache.config import CachePolicy
from cache.encoder import QuestionEncoder
from cache.verifier import MODEL_DIR, Trees, Verifier, exact_conflict, load_verifier

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
    "number_order": ("Is 7 greater than 3?", "Is 3 greater than 7?"),  # an outside audit found these served
    "number_order_less": ("Is 12 less than 5?", "Is 5 less than 12?"),
    "number_order_minus": ("What is 10 minus 4?", "What is 4 minus 10?"),
    "unrelated": ("What is the capital of France?", "How do I bake sourdough bread?"),
}


def judge(encoder: QuestionEncoder, verifier: Verifier, a: str, b: str) -> tuple[bool, float]:
    stored, new = encoder.encode([a, b])
    cosine = float(stored.vector @ new.vector)
    policy = CachePolicy()
    verdict = verifier.judge(stored, new, verifier.threshold_for(policy.semantic_min_precision))
    return cosine >= policy.similarity_threshold and verdict.accepted, verdict.probability


def test_paraphrases_are_accepted(encoder, verifier):
    """All but at most one: at the default target the verifier's recall is about 0.63 on held-out pairs
    (bench/README.md); the shipped one accepts all five today, the weakest at p 0.876 against 0.84."""
    verdicts = {(a, b): judge(encoder, verifier, a, b) for a, b in PARAPHRASES}
    rejected = {pair: round(p, 3) for pair, (accepted, p) in verdicts.items() if not accepted}
    assert len(rejected) <= 1, rejected


@pytest.mark.parametrize("kind", sorted(NEGATIVES))
def test_each_kind_of_look_alike_is_rejected(encoder, verifier, kind):
    a, b = NEGATIVES[kind]
    accepted, probability = judge(encoder, verifier, a, b)
    assert not accepted, f"{kind}: {a!r} / {b!r}: p={probability:.3f}"


def test_features_are_symmetric(encoder):
    a, b = encoder.encode(["Is Paris larger than London?", "Is London, by area, larger than Paris?"])
    assert pair_features(a, b).shape == (len(FEATURES),)
    assert np.allclose(pair_features(a, b), pair_features(b, a), atol=1e-5)


def test_spelling_slips_count_as_matched_and_directional_swaps_are_told_apart(encoder):
    def feature(name: str, a: str, b: str) -> float:
        return float(pair_features(*encoder.encode([a, b]))[FEATURES.index(name)])

    slip = ("What is the melting point of mercury?", "What is the mleting point of mercruy?")
    assert feature("typo_matches", *slip) == 4 and feature("unmatched_plain_max", *slip) == 0
    assert feature("worst_match_typo_min", *slip) > feature("worst_content_match_min", *slip) + 0.2
    other = ("What is the capital of Gambia?", "What is the capital of Zambia?")  # first letter: no slip
    assert feature("typo_matches", *other) == 0 and feature("unmatched_plain_max", *other) == 1
    wrapped = ("Who wrote Hamlet?", "Quick question: who wrote Hamlet? Thanks")
    assert feature("unmatched_plain_max", *wrapped) == 0 < feature("unmatched_content_max", *wrapped)
    assert (
        feature("relation_swapped", "How do I fly from Oslo to Rome?", "How do I fly from Rome to Oslo?") == 1
    )
    assert feature("relation_swapped", "What separates Oslo and Rome?", "What separates Rome and Oslo?") == 0


def test_question_marks_spaces_and_case_do_not_change_the_encoding(encoder):
    plain, *variants = encoder.encode(
        [
            "What is the capital of France?",
            "What is  the capital of France",
            "what is the capital of france ?!",
        ]
    )
    for variant in variants:
        assert [w.lower() for w in variant.words] == [w.lower() for w in plain.words]
        assert np.array_equal(variant.vector, plain.vector)
        assert np.array_equal(variant.word_vectors, plain.word_vectors)
    assert encoder.encode(["What?"])[0].text == "What" and encoder.encode(["?!"])[0].text == "?!"


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


def test_units_named_on_both_sides_are_an_exact_rule(encoder):
    inch, cm, plain = encoder.encode(
        [
            "How long is a credit card in inches?",
            "How long is a credit card in centimeters?",
            "How long is a credit card?",
        ]
    )
    assert exact_conflict(inch, cm)
    assert not exact_conflict(inch, plain)  # one side names no unit: the verifier decides


def test_currencies_are_units_however_they_are_written(encoder):
    """Issue 40: "£800" and "USD $800" name other currencies (an exact rule); "$800" / "800 dollars" /
    "USD 800" / "US$800" name one (the verifier decides)."""
    pound, usd_sign, dollars, usd_code, us_dollar = encoder.encode(
        [
            "What is a good phone for under £800?",
            "Which is the best phone under USD $800?",
            "good phone under 800 dollars",
            "good phone under USD 800",
            "good phone under US$800",
        ]
    )
    assert exact_conflict(pound, usd_sign)
    assert not any(exact_conflict(usd_sign, other) for other in (dollars, usd_code, us_dollar))


def test_order_words_and_yes_no_questions_are_features(encoder):
    first, nxt, how, polar = encoder.encode(
        [
            "which instrument should i learn first",
            "which instrument should i learn next",
            "How does green tea help with sleep?",
            "Does green tea keep you awake?",
        ]
    )
    column = {name: i for i, name in enumerate(FEATURES)}
    assert pair_features(first, nxt)[column["sequence_differs"]] == 1
    assert pair_features(how, polar)[column["polar_differs"]] == 1
    assert pair_features(first, first)[column["sequence_differs"]] == 0


def test_onnx_trees_match_a_walk_of_the_shipped_arrays(verifier):
    weights = np.load(MODEL_DIR / "verifier.npz")
    trees = Trees(
        *(weights[n] for n in ("feature", "threshold", "left", "right", "missing_left", "leaf", "value")), 0.0
    )
    rows = np.random.default_rng(0).random((20, len(FEATURES))) * 3
    rows[:, 14:17] = rows[:, 14:17] > 1.5
    walked = np.array(
        [sum(_leaf_value(trees, t, row) for t in range(trees.feature.shape[0])) for row in rows]
    )
    baseline = json.loads((MODEL_DIR / "verifier.json").read_text())["baseline"]
    expected = 1 / (1 + np.exp(-(walked + baseline)))
    assert np.allclose(verifier.probabilities(rows), expected, atol=1e-5)


def _leaf_value(trees: Trees, tree: int, row: np.ndarray) -> float:
    node = 0
    while not trees.leaf[tree, node]:
        value = row[trees.feature[tree, node]]
        go_left = trees.missing_left[tree, node] if np.isnan(value) else value <= trees.threshold[tree, node]
        node = trees.left[tree, node] if go_left else trees.right[tree, node]
    return float(trees.value[tree, node])
