"""Which deployments may serve an alias, in which order: strategies, breakers, fallbacks."""

import random
import time
from collections.abc import Callable

from backends.base import Backend
from routing.breaker import CircuitBreaker
from routing.config import RoutingPolicy, RoutingSettings, StrategyName
from routing.metrics import RoutingMetrics
from routing.prefix import PrefixIndex, block_hashes, render_prompt
from routing.replica import PeakEwma, Replica
from routing.retry import RetryBudget
from routing.strategies import (
    EngineScore,
    LeastOutstanding,
    PeakEwmaP2C,
    PrefixAffinity,
    RoundRobin,
    RouteRequest,
    Strategy,
    WeightedRandom,
)

PREFIX_AWARE = {"prefix_affinity", "engine_score"}


class Router:
    def __init__(
        self,
        pools: dict[str, list[Backend]],
        settings: RoutingSettings,
        fallbacks: dict[str, list[str]],
        metrics: RoutingMetrics,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self._fallbacks = fallbacks
        self.prefixes = PrefixIndex(settings.prefix_entries_per_replica)
        self.pools = self._replicas(pools)
        self._strategies = self._build_strategies(rng or random.Random())

    def _replicas(self, pools: dict[str, list[Backend]]) -> dict[str, list[Replica]]:
        by_backend: dict[int, Replica] = {}
        for alias, backends in pools.items():
            engine = alias in self.settings.engine_pools
            for backend in backends:
                if id(backend) not in by_backend:
                    by_backend[id(backend)] = self._replica(backend, engine)
        return {alias: [by_backend[id(b)] for b in backends] for alias, backends in pools.items()}

    def _replica(self, backend: Backend, engine_pool: bool) -> Replica:
        name, s = backend.name, self.settings
        breaker = CircuitBreaker(
            s.failures_to_open, s.open_cooldown_s, s.half_open_probes, self.clock,
            on_change=lambda state: self.metrics.set_breaker(name, state),
        )  # fmt: skip
        self.metrics.set_breaker(name, "closed")
        is_engine = engine_pool or backend.config.backend == "local_engine"
        budget = RetryBudget(s.retry_budget_ratio, s.retry_budget_min_per_s, s.retry_budget_burst, self.clock)
        return Replica(backend, breaker, PeakEwma(s.ewma_decay_s, self.clock), is_engine, budget)

    def _build_strategies(self, rng: random.Random) -> dict[StrategyName, Strategy]:
        s = self.settings
        return {
            "weighted_random": WeightedRandom(rng),
            "round_robin": RoundRobin(),
            "least_outstanding": LeastOutstanding(rng, s.metrics_stale_s),
            "peak_ewma": PeakEwmaP2C(rng),
            "prefix_affinity": PrefixAffinity(
                self.prefixes, s.load_epsilon, s.load_slack, s.metrics_stale_s, rng
            ),
            "engine_score": EngineScore(
                self.prefixes, s.score_weights, s.metrics_stale_s, rng, s.load_epsilon, s.load_slack
            ),
        }

    def record_prefix(self, replica: Replica, hashes: list[bytes]) -> None:
        """The prompt's blocks are now in `replica`'s KV cache; its index holds as many blocks as that cache
        does where the engine exports its size (prefix_chars_per_token converts tokens to characters)."""
        kv_tokens = replica.engine.kv_tokens
        s = self.settings
        capacity = (
            None if kv_tokens is None else int(kv_tokens * s.prefix_chars_per_token / s.prefix_block_chars)
        )
        self.prefixes.record(replica.name, hashes, capacity)

    def set_pools(self, pools: dict[str, list[Backend]]) -> None:
        """New aliases/deployments (admin API); replicas of backends kept keep their breaker and load state."""
        known = {id(r.backend): r for r in self.all_replicas()}
        fresh = self._replicas({a: [b for b in bs if id(b) not in known] for a, bs in pools.items()})
        by_backend = {**known, **{id(r.backend): r for rs in fresh.values() for r in rs}}
        self.pools = {alias: [by_backend[id(b)] for b in backends] for alias, backends in pools.items()}

    def all_replicas(self) -> list[Replica]:
        return list({id(r): r for pool in self.pools.values() for r in pool}.values())

    def strategy_name(self, alias: str, policy: RoutingPolicy | None) -> StrategyName:
        if policy and (policy.strategies.get(alias) or policy.strategy):
            return policy.strategies.get(alias) or policy.strategy
        if alias in self.settings.strategies:
            return self.settings.strategies[alias]
        engine = any(r.engine_pool for r in self.pools.get(alias, []))
        return self.settings.engine_strategy if engine else self.settings.default_strategy

    def plan(
        self, alias: str, replicas: list[Replica], endpoint: str, body: dict, policy: RoutingPolicy | None,
        priority: int | None = None,
    ) -> tuple[list[Replica], list[bytes]]:  # fmt: skip
        """The try order for one request, and the prompt's block hashes (empty if not prefix-aware)."""
        name = self.strategy_name(alias, policy)
        hashes = []
        if name in PREFIX_AWARE:
            hashes = block_hashes(render_prompt(endpoint, body), self.settings.prefix_block_chars)
        now = self.clock()
        ready = [r for r in replicas if not r.cooling(now)]  # an upstream Retry-After is never overridden
        available = [r for r in ready if r.breaker.available()] or ready  # all ejected: try anyway
        if not available:
            return [], hashes
        return self._strategies[name].order(available, RouteRequest(hashes, now, priority)), hashes

    def fallbacks(self, alias: str, policy: RoutingPolicy | None) -> list[str]:
        extra = policy.fallbacks.get(alias, []) if policy else []
        chain = [*self._fallbacks.get(alias, []), *extra]
        return [a for i, a in enumerate(chain) if a != alias and a not in chain[:i]]

    def max_attempts(self, policy: RoutingPolicy | None) -> int:
        return (policy.max_attempts if policy else None) or self.settings.max_attempts
