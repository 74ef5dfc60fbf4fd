"""The escalation share: a cascade's threshold follows its recent scores so a set share is escalated."""

import math
import random

import pytest
from pydantic import ValidationError

from routing.config import ConfidenceConfig
from routing.escalation import EscalationShare


def test_the_fixed_threshold_decides_until_the_warmup_is_seen() -> None:
    share = EscalationShare(0.4, window=100, warmup=10, fallback=-0.4)
    for score in range(9):
        share.record(float(score))
    assert share.threshold() == -0.4
    share.record(9.0)  # scores 0..9: 4 of 10 lie below 4.0
    assert share.threshold() == 4.0


def test_the_threshold_is_the_share_quantile_of_the_last_window_scores() -> None:
    share = EscalationShare(0.25, window=8, warmup=1, fallback=0.0)
    for score in [10, 11, 12, 13, 14, 15, 16, 17]:
        share.record(float(score))
    assert share.threshold() == 12.0  # 2 of 8 below
    for score in [0, 1, 2, 3]:  # the four oldest (10-13) leave the window
        share.record(float(score))
    assert len(share) == 8 and share.threshold() == 2.0  # window 0 1 2 3 14 15 16 17


@pytest.mark.parametrize("target", [0.2, 0.4, 0.6])
def test_the_share_holds_where_a_fixed_threshold_drifts_with_the_traffic(target: float) -> None:
    """Scores whose level shifts halfway (another kind of traffic): a threshold fixed on the first half
    escalates far more of the second; the share stays at its target on both halves."""
    rng = random.Random(7)
    first = [rng.gauss(0.0, 1.0) for _ in range(4000)]
    second = [rng.gauss(-1.5, 1.0) for _ in range(4000)]
    fixed = sorted(first)[int(target * len(first))]
    share = EscalationShare(target, window=500, warmup=50, fallback=fixed)
    escalated = []
    for score in first + second:
        escalated.append(score < share.threshold())
        share.record(score)
    late = escalated[4500:]  # after the new traffic has filled the window
    assert sum(late) / len(late) == pytest.approx(target, abs=0.04)
    assert sum(s < fixed for s in second) / len(second) > target + 0.3  # what the fixed one would do


def test_unscored_escalations_count_toward_the_share() -> None:
    share = EscalationShare(0.3, window=10, warmup=1, fallback=0.0)
    for score in [-math.inf, -math.inf, 1, 2, 3, 4, 5, 6, 7, 8]:
        share.record(float(score))
    assert share.threshold() == 2.0  # below it: the two forced escalations and the score 1, 3 of 10
    share = EscalationShare(0.3, window=10, warmup=1, fallback=0.0)
    for score in [-math.inf] * 5 + [1.0] * 5:
        share.record(score)
    assert share.threshold() == -math.inf  # forced escalations alone exceed the share: none is added
    share.record(float("nan"))  # a scorer that returned NaN counts as the lowest
    assert share.threshold() == -math.inf


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        EscalationShare(1.0, 10, 1, 0.0)
    with pytest.raises(ValueError):
        EscalationShare(0.5, 10, 11, 0.0)
    with pytest.raises(ValidationError):
        ConfidenceConfig(escalate_share=0.5, share_window=100, share_warmup=200)
    with pytest.raises(ValidationError):
        ConfidenceConfig(escalate_share=0.0)
    assert ConfidenceConfig(escalate_share=0.4).share_window == 500
