"""A cascade's escalation share held near a target: the threshold follows the traffic's own scores.

A fixed confidence threshold escalates a different share on every kind of traffic: the shipped learned
confidence at 0.08 escalated 60 % of TriviaQA, 63 % of EntityQuestions and 84 % of LAMBADA (bench/README.md),
because its calibration does not carry from the set it was fit on. Cost follows the share, so an operator
who budgets "escalate 40 %" sets `confidence.escalate_share: 0.4` instead: the threshold becomes the 40th
percentile of the last `share_window` scores this cascade saw, and the answers below it are escalated.
Until `share_warmup` scores are seen, the configured `threshold` decides.

Escalations the score did not decide (the small model failed, or its answer was cut by `max_small_tokens`)
enter the window as -inf, so they count toward the share: the share is of all requests, not only judged ones.
Each gateway replica keeps its own window; behind a load balancer each sees a sample of the same traffic, so
their thresholds agree within sampling noise (no shared state, nothing to lose when Redis is down).
"""

import bisect
import math
from collections import deque


class EscalationShare:
    """The `share` quantile of the last `window` scores; `fallback` until `warmup` scores are in."""

    def __init__(self, share: float, window: int, warmup: int, fallback: float) -> None:
        if not 0.0 < share < 1.0:
            raise ValueError(f"escalate_share must be in (0, 1), got {share}")
        if not 1 <= warmup <= window:
            raise ValueError(f"share_warmup must be in [1, share_window], got {warmup} > {window}")
        self.share, self.fallback = share, fallback
        self._arrivals: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []
        self._warmup = warmup

    def threshold(self) -> float:
        """Scores at or above this are kept: a share `share` of the window lies strictly below it (less
        where scores tie)."""
        if len(self._sorted) < self._warmup:
            return self.fallback
        return self._sorted[math.floor(self.share * len(self._sorted))]

    def record(self, score: float) -> None:
        """One decided request's score (-inf for an escalation the score did not decide)."""
        if math.isnan(score):
            score = -math.inf
        if len(self._arrivals) == self._arrivals.maxlen:
            oldest = self._arrivals[0]
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._arrivals.append(score)
        bisect.insort(self._sorted, score)

    def __len__(self) -> int:
        return len(self._sorted)
