"""The evaluation's arithmetic (curves, APGR, CPT), the answer checker and the labeled task set."""

from collections import Counter

import numpy as np
import pytest

from bench.cascade_live import is_correct, load_tasks
from bench.routing_curves import oracle_scores, random_curve, routing_curve
from routing.confidence import mean_logprob, min_window
from routing.learned import GainModel, LogisticModel, load_model, logprob_features


def test_task_set_is_large_and_varied() -> None:
    tasks = load_tasks()
    kinds = Counter(t["type"] for t in tasks)
    assert len(tasks) >= 300 and len(kinds) >= 5 and min(kinds.values()) >= 40
    assert len({t["id"] for t in tasks}) == len(tasks)


@pytest.mark.parametrize(
    ("check", "answer", "text", "ok"),
    [
        ("number", "42", "42", True),
        ("number", "42", "The answer is 42.", True),
        ("number", "42", "24", False),
        ("number", "1000", "1,000", True),
        ("yesno", "no", "No, it is not.", True),
        ("yesno", "no", "Yes.", False),
        ("text", "Paris", "The capital is Paris.", True),
        ("text", "Rome", "Romania", False),
        ("text", "Paris", "London\nParis", False),  # only the first line counts
    ],
)
def test_answer_checker(check: str, answer: str, text: str, ok: bool) -> None:
    assert is_correct({"check": check, "answer": answer, "aliases": []}, text) is ok


def test_random_router_has_apgr_one_half_and_linear_cpt() -> None:
    rng = np.random.default_rng(0)
    weak, strong = (rng.random(1000) < 0.6).astype(float), (rng.random(1000) < 0.8).astype(float)
    curve = random_curve(weak, strong)
    assert curve.apgr() == pytest.approx(0.5)
    assert curve.cpt(0.5) == pytest.approx(0.5) and curve.cpt(0.8) == pytest.approx(0.8)


def test_oracle_beats_random_and_a_bad_router_loses() -> None:
    rng = np.random.default_rng(1)
    weak, strong = (rng.random(2000) < 0.6).astype(float), (rng.random(2000) < 0.8).astype(float)
    oracle = routing_curve(oracle_scores(weak, strong), weak, strong)
    worst = routing_curve(-oracle_scores(weak, strong), weak, strong)
    assert oracle.apgr() > 0.9 and worst.apgr() < 0.2
    assert oracle.cpt(0.8) < 0.3
    assert oracle.quality[0] == pytest.approx(weak.mean()) and oracle.quality[-1] == pytest.approx(
        strong.mean()
    )


def test_confidence_statistics() -> None:
    values = [-0.1, -0.1, -2.0, -2.0, -0.1]
    assert mean_logprob(values) == pytest.approx(-0.86)
    assert min_window(values, 2) == pytest.approx(-2.0)
    assert min_window(values[:1], 4) == pytest.approx(-0.1)
    assert logprob_features([]).shape == logprob_features(values).shape == (5,)


def test_logistic_model_round_trips(tmp_path) -> None:  # noqa: ANN001
    model = LogisticModel(np.array([1.0, -2.0]), 0.5, np.array([0.0, 1.0]), np.array([1.0, 2.0]), False)
    model.save(tmp_path / "m.npz")
    loaded = load_model(tmp_path / "m.npz")
    x = np.array([[1.0, 3.0]])
    assert loaded.predict(x)[0] == pytest.approx(1 / (1 + np.exp(-(1.0 - 2.0 + 0.5))))


def test_gain_model_confidence_is_the_difference(tmp_path) -> None:  # noqa: ANN001
    small = LogisticModel(np.array([1.0]), 0.0, np.zeros(1), np.ones(1), False)
    large = LogisticModel(np.array([-1.0]), 0.0, np.zeros(1), np.ones(1), False)
    GainModel(small, large).save(tmp_path / "g.npz")
    loaded = load_model(tmp_path / "g.npz")
    x = np.array([[2.0]])
    assert loaded.confidence(x)[0] == pytest.approx(small.predict(x)[0] - large.predict(x)[0])
