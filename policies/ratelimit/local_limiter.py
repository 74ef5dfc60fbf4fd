"""The in-process limiter: the same semantics as the Redis scripts, for one replica.

Used when no Redis is configured, and as the fail-open fallback while Redis is unreachable.
Every method runs without awaiting, so each admission is atomic on the event loop.
"""

import time
from collections import deque
from dataclasses import dataclass, field

from policies.ratelimit.buckets import Bucket, BucketState, Decision, Held, Replayed, Spend, holds_lease


@dataclass
class _Log:
    entries: deque[tuple[float, str]] = field(default_factory=deque)
    weights: dict[str, float] = field(default_factory=dict)
    total: float = 0.0

    def prune(self, cutoff: float) -> None:
        while self.entries and self.entries[0][0] <= cutoff:
            _, member = self.entries.popleft()
            self.total -= self.weights.pop(member, 0.0)

    def retry_after(self, need: float, now: float, window: float) -> float:
        freed = 0.0
        for ts, member in self.entries:
            freed += self.weights.get(member, 0.0)
            if freed >= need:
                return ts + window - now
        return window


class LocalLimiter:
    def __init__(self, window_s: int, lease_s: float) -> None:
        self._window = float(window_s)
        self._lease = float(lease_s)
        self._logs: dict[str, _Log] = {}
        self._leases: dict[str, dict[str, float]] = {}  # bucket -> member -> expires_at
        self._reserved: dict[
            str, dict[str, tuple[float, float]]
        ] = {}  # budget -> member -> (usd, expires_at)
        self._spend: dict[str, tuple[float, float]] = {}  # name -> (usd, expires_at)

    async def admit(self, member: str, buckets: list[Bucket], failure_mode: str | None = None) -> Decision:
        now = time.time()
        used = [self._used(bucket, now) for bucket in buckets]
        failed = next((i for i, b in enumerate(buckets) if not _fits(b, used[i])), None)
        if failed is None:
            for bucket in buckets:
                self._charge(bucket, member, now)
            used = [u + _admission_cost(b) for b, u in zip(buckets, used, strict=True)]
        states = [
            self._state(b, u, now, i == failed) for i, (b, u) in enumerate(zip(buckets, used, strict=True))
        ]
        return Decision(failed is None, states, states[failed] if failed is not None else None)

    async def settle(self, member: str, buckets: list[Bucket], tokens: int, spends: list[Spend]) -> None:
        for bucket in buckets:
            if bucket.kind == "tokens":
                self._reweight(self._logs.get(_key(bucket)), member, float(tokens))
            elif bucket.kind == "concurrency":
                self._leases.get(_key(bucket), {}).pop(member, None)
            elif bucket.kind == "budget":
                self._reserved.get(_key(bucket), {}).pop(member, None)
        now = time.time()
        for spend in spends:
            usd = self._spent(_spend_key(spend.scope, spend.name), now)
            self._spend[_spend_key(spend.scope, spend.name)] = (usd + spend.amount_usd, now + spend.ttl_s)

    async def renew(self, held: list[Held]) -> None:
        expires_at = time.time() + self._lease
        for member, buckets in held:
            for bucket in filter(holds_lease, buckets):
                if bucket.kind == "concurrency" and member in (leases := self._leases.get(_key(bucket), {})):
                    leases[member] = expires_at
                elif member in (reserved := self._reserved.get(_key(bucket), {})):
                    reserved[member] = (reserved[member][0], expires_at)

    async def drain(self) -> None:
        return None

    async def replay(self, admitted: list[Replayed]) -> None:
        return None  # only ever the fallback: nothing is admitted elsewhere on its behalf

    async def aclose(self) -> None:
        return None

    async def seed_spend(self, spends: list[Spend]) -> None:
        now = time.time()
        for spend in spends:
            key = _spend_key(spend.scope, spend.name)
            if key not in self._spend:
                self._spend[key] = (spend.amount_usd, now + spend.ttl_s)

    def _used(self, bucket: Bucket, now: float) -> float:
        key = _key(bucket)
        if bucket.kind == "concurrency":
            leases = self._leases.setdefault(key, {})
            for member in [m for m, expiry in leases.items() if expiry <= now]:
                del leases[member]
            return float(len(leases))
        if bucket.kind == "budget":
            reserved = self._reserved.setdefault(key, {})
            for member in [m for m, (_, expiry) in reserved.items() if expiry <= now]:
                del reserved[member]
            return self._spent(key, now) + sum(usd for usd, _ in reserved.values())
        log = self._logs.setdefault(key, _Log())
        log.prune(now - self._window)
        return log.total

    def _charge(self, bucket: Bucket, member: str, now: float) -> None:
        if bucket.kind == "concurrency":
            self._leases[_key(bucket)][member] = now + self._lease
        elif bucket.kind == "budget" and bucket.cost > 0:
            self._reserved[_key(bucket)][member] = (bucket.cost, now + self._lease)
        elif bucket.kind in ("requests", "tokens"):
            log = self._logs[_key(bucket)]
            log.entries.append((now, member))
            log.weights[member] = bucket.cost
            log.total += bucket.cost

    def _state(self, bucket: Bucket, used: float, now: float, failed: bool) -> BucketState:
        if bucket.kind == "budget":
            return BucketState(bucket, used, 0.0, bucket.retry_hint_s if failed else 0.0)
        if bucket.kind == "concurrency":
            return BucketState(bucket, used, 0.0, 0.0)
        log = self._logs[_key(bucket)]
        reset = log.entries[0][0] + self._window - now if log.entries else 0.0
        retry = 0.0
        if failed:
            too_large = bucket.cost > bucket.limit
            retry = (
                -1.0 if too_large else log.retry_after(used + bucket.cost - bucket.limit, now, self._window)
            )
        return BucketState(bucket, used, reset, retry)

    def _spent(self, key: str, now: float) -> float:
        usd, expires_at = self._spend.get(key, (0.0, 0.0))
        return usd if expires_at > now else 0.0

    @staticmethod
    def _reweight(log: _Log | None, member: str, tokens: float) -> None:
        if log is not None and member in log.weights:
            log.total += tokens - log.weights[member]
            log.weights[member] = tokens


def _admission_cost(bucket: Bucket) -> float:
    return 1.0 if bucket.kind == "concurrency" else bucket.cost


def _fits(bucket: Bucket, used: float) -> bool:
    if bucket.kind == "budget":
        return used < bucket.limit
    return used + _admission_cost(bucket) <= bucket.limit


def _key(bucket: Bucket) -> str:
    return _spend_key(bucket.scope, bucket.name)


def _spend_key(scope: str, name: str) -> str:
    return f"{scope}\x00{name}"
