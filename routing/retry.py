"""How often and how soon a failed attempt is tried again: backoff with jitter and a retry budget.

The budget is Finagle's idea as a token bucket, one per deployment: every first attempt sent to the
deployment deposits `ratio` tokens, the clock adds `min_per_s` tokens a second, and every retry sent to it
withdraws one; at most `burst` tokens are kept. So retries add at most `ratio` (plus a small floor) to the
load a deployment sees however many requests fail: a failing fleet cannot be hit by a retry storm.
"""

import random
import time
from collections.abc import Callable


class RetryBudget:
    def __init__(
        self, ratio: float, min_per_s: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ratio = ratio
        self._min_per_s = min_per_s
        self._burst = burst
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def deposit(self) -> None:
        """A first attempt went to this deployment."""
        self._refill()
        self._tokens = min(self._burst, self._tokens + self._ratio)

    def withdraw(self) -> bool:
        """May a retry go to this deployment now? Takes a token if so."""
        self._refill()
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._min_per_s)
        self._at = now


def backoff_s(attempt: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(max_s, base_s * 2^(attempt-1))]."""
    ceiling = min(max_s, base_s * 2 ** max(attempt - 1, 0))
    return rng.uniform(0, ceiling)
