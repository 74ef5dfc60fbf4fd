"""Load-balancing strategies. Each orders a pool's available replicas: the first is tried first,
the rest are the retry order.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from routing.config import ScoreWeights
from routing.prefix import PrefixIndex
from routing.replica import Replica


@dataclass
class RouteRequest:
    hashes: list[bytes] = field(default_factory=list)  # the prompt's chained block hashes
    now: float = 0.0
    priority: int | None = None  # its service class's rank (lower runs first), where admission gave one


class Strategy(Protocol):
    def order(self, replicas: list[Replica], request: RouteRequest) -> list[Replica]: ...


class WeightedRandom:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def order(self, replicas: list[Replica], request: RouteRequest) -> list[Replica]:
        """Weighted order without replacement (Efraimidis–Spirakis keys)."""
        return sorted(replicas, key=lambda r: self._rng.random() ** (1.0 / r.weight), reverse=True)


class RoundRobin:
    """Replicas in turn, whatever their load or cache: the baseline of trace replays (issue 43)."""

    def __init__(self) -> None:
        self._next = 0

    def order(self, replicas: list[Replica], request: RouteRequest) -> list[Replica]:
        start = self._next % len(replicas) if replicas else 0
        self._next += 1
        return replicas[start:] + replicas[:start]


class LeastOutstanding:
    def __init__(self, rng: random.Random, stale_s: float) -> None:
        self._rng = rng
        self._stale_s = stale_s

    def order(self, replicas: list[Replica], request: RouteRequest) -> list[Replica]:
        return by_load(replicas, request.now, self._stale_s, self._rng)


def by_load(replicas: list[Replica], now: float, stale_s: float, rng: random.Random) -> list[Replica]:
    return sorted(replicas, key=lambda r: (r.queue_depth(now, stale_s) / r.weight, rng.random()))


class PeakEwmaP2C:
    """Power of two choices on cost = peak-EWMA latency × (outstanding + 1) / weight."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def order(self, replicas: list[Replica], request: RouteRequest) -> list[Replica]:
        if len(replicas) < 2:
            return list(replicas)
        pair = self._rng.sample(replicas, 2)
        first = min(pair, key=self._cost)
        rest = sorted((r for r in replicas if r is not first), key=self._cost)
        return [first, *rest]

    @staticmethod
    def _cost(replica: Replica) -> float:
        return (replica.latency.value + 1e-3) * (replica.outstanding + 1) / replica.weight


class PrefixAffinity:
    """Longest cached prefix wins, unless that replica is over (1+ε)× the mean load: then least loaded."""

    def __init__(
        self, index: PrefixIndex, epsilon: float, slack: float, stale_s: float, rng: random.Random
    ) -> None:
        self._index = index
        self._epsilon = epsilon
        self._slack = slack
        self._stale_s = stale_s
        self._rng = rng

    def order(self, replicas: list[Replica], request: RouteRequest) -> list[Replica]:
        loaded = by_load(replicas, request.now, self._stale_s, self._rng)
        matches = {r.name: self._index.match(r.name, request.hashes) for r in replicas}
        best = max(loaded, key=lambda r: matches[r.name])  # stable: ties go to the least loaded
        bound = load_bound(replicas, request.now, self._stale_s, self._epsilon, self._slack)
        if matches[best.name] and best.queue_depth(request.now, self._stale_s) + 1 <= bound:
            return [best, *(r for r in loaded if r is not best)]
        return loaded


def load_bound(replicas: list[Replica], now: float, stale_s: float, epsilon: float, slack: float) -> float:
    """Bounded load (consistent hashing with bounded loads): the most requests a replica may hold after
    taking this one: (1+ε) × the mean after this request, or mean + slack at low load."""
    mean = (sum(r.queue_depth(now, stale_s) for r in replicas) + 1) / len(replicas)
    return max((1 + epsilon) * mean, mean + slack)


class EngineScore:
    """Combined score for engine replicas: prefix match share − queue depth − KV-cache usage, weighted.

    Replicas over the bounded-load limit (as in PrefixAffinity) come after all others whatever their
    score: on an H200 with cheap prefill, the unbounded score piled a group's requests onto one engine and
    gave the worst mean TTFT of four strategies (bench/README.md, "Engine-aware routing").
    """

    def __init__(
        self, index: PrefixIndex, weights: ScoreWeights, stale_s: float, rng: random.Random,
        epsilon: float = 0.25, slack: float = 2.0,
    ) -> None:  # fmt: skip
        self._index = index
        self._weights = weights
        self._stale_s = stale_s
        self._rng = rng
        self._epsilon = epsilon
        self._slack = slack

    def order(self, replicas: list[Replica], request: RouteRequest) -> list[Replica]:
        score = self.scorer(replicas, request)
        bound = load_bound(replicas, request.now, self._stale_s, self._epsilon, self._slack)

        def over(r: Replica) -> bool:
            return r.queue_depth(request.now, self._stale_s) + 1 > bound

        return sorted(replicas, key=lambda r: (over(r), -score(r), self._rng.random()))

    def scorer(self, replicas: list[Replica], request: RouteRequest) -> Callable[[Replica], float]:
        now, blocks = request.now, max(len(request.hashes), 1)
        mean_depth = sum(r.queue_depth(now, self._stale_s) for r in replicas) / len(replicas)
        ahead = {r.name: r.prefill_ahead(request.priority) for r in replicas}
        mean_pending = sum(ahead.values()) / len(replicas)
        w = self._weights

        def score(r: Replica) -> float:
            matched = self._index.match(r.name, request.hashes)
            queue = r.queue_depth(now, self._stale_s) / (mean_depth + 1)  # relative to the pool's load
            # the blocks it would prefill before this prompt's first token, and this prompt's own
            prefill = (ahead[r.name] + blocks - matched) / (mean_pending + blocks)
            return (w.prefix * matched / blocks - w.queue * queue - w.kv_usage * r.kv_usage(now, self._stale_s)
                    - w.prefill * prefill)  # fmt: skip

        return score
