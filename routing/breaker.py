"""Per-deployment circuit breaker: passive ejection after consecutive failures, half-open probes after."""

import time
from collections.abc import Callable

CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"


class CircuitBreaker:
    def __init__(
        self,
        failures_to_open: int,
        cooldown_s: float,
        half_open_probes: int = 1,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self._failures_to_open = failures_to_open
        self._cooldown_s = cooldown_s
        self._probes = half_open_probes
        self._clock = clock
        self._on_change = on_change or (lambda state: None)
        self._state = CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probes_out = 0

    @property
    def state(self) -> str:
        if self._state == OPEN and self._clock() - self._opened_at >= self._cooldown_s:
            self._set(HALF_OPEN)
        return self._state

    def available(self) -> bool:
        """May a request go here now? Half-open lets a few probes through."""
        state = self.state
        return state == CLOSED or (state == HALF_OPEN and self._probes_out < self._probes)

    def reopens_in(self) -> float:
        """Seconds until an open breaker lets probes through (0 when it is not open)."""
        if self.state != OPEN:
            return 0.0
        return max(self._cooldown_s - (self._clock() - self._opened_at), 0.0)

    def on_dispatch(self) -> None:
        if self.state == HALF_OPEN:
            self._probes_out += 1

    def on_success(self) -> None:
        self._failures = 0
        if self._state != CLOSED:
            self._set(CLOSED)

    def on_failure(self) -> None:
        self._failures += 1
        if self.state == HALF_OPEN or self._failures >= self._failures_to_open:
            self.trip()

    def trip(self) -> None:
        """Open now (also used by failed active health checks)."""
        self._opened_at = self._clock()
        self._set(OPEN)

    def probe_ok(self) -> None:
        """A health check passed: an open breaker may try real requests again."""
        if self._state == OPEN:
            self._set(HALF_OPEN)

    def _set(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self._probes_out = 0
            self._on_change(state)
