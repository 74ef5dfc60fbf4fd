"""The study's own check (studies/router_ceiling.py): the subject ceiling is the question oracle when subjects
split the gains. It lives beside the study, since nothing under tests/ imports studies/ (pyproject's testpaths
collect it: `python -m pytest studies/test_router_ceiling.py`)."""

import numpy as np
import pytest

from bench.lib.routing_curves import routing_curve
from studies.router_ceiling import halves, in_sample_oracle


def test_the_subject_ceiling_is_the_question_oracle_when_subjects_split_the_gains() -> None:
    rng = np.random.default_rng(3)
    weak = rng.integers(0, 2, 400).astype(float)
    strong = np.where(np.arange(400) < 200, 1.0, weak)  # subject "a": the strong model fixes every miss
    labels = np.array(["a"] * 200 + ["b"] * 200)
    best = routing_curve(strong - weak, weak, strong).apgr()
    assert in_sample_oracle(labels, weak, strong)["apgr"] < best  # within "a" the order is random
    ordered = np.where(strong > weak, "a", np.where(strong < weak, "c", "b"))  # subjects that are the gain
    assert in_sample_oracle(ordered, weak, strong)["apgr"] == pytest.approx(best, abs=1e-4)
    same = np.array(["x"] * 400)  # one subject: no order at all
    assert abs(in_sample_oracle(same, weak, strong)["apgr"] - 0.5) < 0.05
    assert abs(halves(same, weak, strong)["apgr"] - 0.5) < 0.1
