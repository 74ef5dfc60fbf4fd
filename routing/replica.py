"""A deployment as the router sees it: its backend, breaker, load and the engine's scraped numbers."""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from backends.base import Backend, UpstreamError
from routing.breaker import CircuitBreaker
from routing.retry import RetryBudget


@dataclass
class EngineLoad:
    """Numbers scraped from the deployment's /metrics (vLLM names)."""

    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    prefix_hit_rate: float | None = None  # between the last two scrapes
    hits: float | None = None  # prefix-cache counters as last scraped
    queries: float | None = None
    kv_tokens: float | None = None  # the KV cache's size in tokens (vllm:cache_config_info), when exported
    at: float = -math.inf  # clock time of the scrape


class PeakEwma:
    """Latency estimate that jumps up to a slow sample at once and decays towards fast ones (Finagle's)."""

    def __init__(self, decay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._decay_s = decay_s
        self._clock = clock
        self.value = 0.0
        self._at = clock()

    def observe(self, seconds: float) -> None:
        now = self._clock()
        if seconds > self.value:
            self.value = seconds
        else:
            weight = math.exp(-max(now - self._at, 0.0) / self._decay_s)
            self.value = self.value * weight + seconds * (1 - weight)
        self._at = now


class Replica:
    def __init__(
        self,
        backend: Backend,
        breaker: CircuitBreaker,
        latency: PeakEwma,
        engine_pool: bool,
        retry_budget: RetryBudget | None = None,
    ) -> None:
        self.backend = backend
        self.breaker = breaker
        self.latency = latency
        self.engine_pool = engine_pool
        self.retry_budget = retry_budget or RetryBudget(0.2, 5.0, 10.0)
        self.outstanding = 0
        # prompt blocks not in its cache, of requests still without a first byte, by the priority sent with them
        self.pending_prefill: dict[int | None, int] = {}
        self.engine = EngineLoad()
        self.not_before = -math.inf  # clock time before which it is not tried (upstream Retry-After)
        self.cooled_by: UpstreamError | None = None  # the 429/503 that said so

    def cool_down(self, until: float, error: UpstreamError) -> None:
        if until > self.not_before:
            self.not_before = until
            self.cooled_by = error

    def cooling(self, now: float) -> bool:
        return now < self.not_before

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def weight(self) -> float:
        return max(self.backend.config.weight, 1e-9)

    def queue_depth(self, now: float, stale_s: float) -> float:
        """Our own in-flight count, or the engine's queue when its scrape is fresh and larger."""
        fresh = now - self.engine.at <= stale_s
        scraped = self.engine.waiting + self.engine.running if fresh else 0.0
        return max(float(self.outstanding), scraped)

    def prefill_ahead(self, priority: int | None) -> int:
        """The pending prompt blocks it prefills before a new request's: all of them, or, where it schedules by
        priority (lower runs first), those sent with the request's rank or a more urgent one (or with none)."""
        if priority is None or not self.backend.config.takes_priority():
            return sum(self.pending_prefill.values())
        return sum(n for rank, n in self.pending_prefill.items() if rank is None or rank <= priority)

    def kv_usage(self, now: float, stale_s: float) -> float:
        return self.engine.kv_usage if now - self.engine.at <= stale_s else 0.0
