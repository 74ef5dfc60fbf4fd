"""Latency feedback: while a higher class misses its time-to-first-token target, the classes below it get
fewer of a saturated pool's slots; as it meets its target again they get them back (additive increase,
multiplicative decrease, as TCP shares a congested link).

Slots alone do not say how much one request slows another. Where engines share a GPU (several servers on
one card), or take no priority, a batch flood that leaves an interactive request its slot still slows its
prefill: the engines run their own steps side by side on the card (docs/overload-gpu.md, "the CUDA step
share swept"). The gate caps each class at `pool_share` × its factor of the pool's slots; the factor moves on the
TTFT outcomes of the classes ranked above it over the last `window_s`, counted on every replica of the
fleet (fleet.py publishes them beside the demand):

- more than `max_miss` of them missed (at least `min_samples` seen) while the class held slots somewhere:
  factor × `decrease`, at most once per `interval_s`, not below `min_factor`;
- at most `max_miss` missed, or too few seen to say: factor + `increase` per `interval_s`, up to 1;
- misses while the class holds no slot are not its doing: its factor stays.

The gate still lets a class run one slot whatever its factor, and the queue deadline still refuses what
cannot start in time (429 with Retry-After). A stream's outcome is its first token against its class's
`ttft_s`; a body's is the whole answer against the class's SLO (Lease in admission.py).
"""

import math
from collections import deque
from collections.abc import Callable

from routing.admission.config import ClassName, ServiceClass, SloGuardSettings


class SloGuard:
    def __init__(
        self, settings: SloGuardSettings, classes: dict[ClassName, ServiceClass], clock: Callable[[], float]
    ) -> None:
        self._settings = settings
        self._rank = {name: service.rank for name, service in classes.items()}
        self._ttft = {name: service.ttft_s for name, service in classes.items()}
        self._clock = clock
        self._seen: deque[tuple[float, ClassName, bool]] = deque()
        self._adjusted_at = -math.inf
        self.factor: dict[ClassName, float] = dict.fromkeys(classes, 1.0)
        # the other replicas' outcomes over their window, per class: (met, missed) (fleet.py)
        self.others: dict[ClassName, tuple[float, float]] = {}

    def observe_ttft(self, service: ClassName, ttft_s: float) -> None:
        self.observe(service, ttft_s <= self._ttft[service])

    def observe(self, service: ClassName, met: bool) -> None:
        if not self._settings.enabled:
            return
        now = self._clock()
        self._seen.append((now, service, met))
        self._forget(now)

    def local(self) -> dict[ClassName, tuple[int, int]]:
        """This replica's outcomes over the window, per class: (met, missed)."""
        self._forget(self._clock())
        counts: dict[ClassName, tuple[int, int]] = {}
        for _, service, met in self._seen:
            hits, misses = counts.get(service, (0, 0))
            counts[service] = (hits + met, misses + (not met))
        return counts

    def adjust(self, holds: Callable[[ClassName], bool]) -> bool:
        """At most once per `interval_s`: move each class's factor (`holds`: the class runs somewhere in the
        fleet). True when a factor grew (the gate's next tick starts what now fits)."""
        now = self._clock()
        if not self._settings.enabled or now - self._adjusted_at < self._settings.interval_s:
            return False
        self._adjusted_at = now
        counts: dict[ClassName, tuple[float, float]] = dict(self.local())
        for service, (met, missed) in self.others.items():
            seen_met, seen_missed = counts.get(service, (0, 0))
            counts[service] = (seen_met + met, seen_missed + missed)
        grew = False
        for service, rank in self._rank.items():
            met = sum(m for other, (m, _) in counts.items() if self._rank[other] < rank)
            missed = sum(x for other, (_, x) in counts.items() if self._rank[other] < rank)
            known = met + missed >= self._settings.min_samples
            if known and missed > self._settings.max_miss * (met + missed):
                if holds(service):
                    self.factor[service] = max(
                        self._settings.min_factor, self.factor[service] * self._settings.decrease
                    )
            elif self.factor[service] < 1.0:
                self.factor[service] = min(1.0, self.factor[service] + self._settings.increase)
                grew = True
        return grew

    def _forget(self, now: float) -> None:
        while self._seen and self._seen[0][0] < now - self._settings.window_s:
            self._seen.popleft()
