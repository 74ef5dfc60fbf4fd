"""Redis first, behind a circuit breaker; while Redis is unavailable, each policy's failure mode decides.

- fail-open: an in-process limiter admits, holding this replica to its share of every limit (the limit
  divided by the live replicas, see replicas.py; requests and slots rounded down, at least one);
- fail-closed: 503 with OpenAI's error shape and Retry-After (when Redis is tried again).

Unavailable means no answer within the timeout, a lost connection, or a reply saying Redis cannot serve
(BUSY, LOADING, OOM, READONLY, MASTERDOWN, ...): the breaker opens at once and Redis is tried again by
one probe after `retry_s`, so limits are exact again within about `retry_s` of Redis returning. The
requests admitted locally meanwhile are replayed into Redis's RPM/TPM logs ahead of that probe, so the
windows that span the outage count them (with their settled tokens). Any other
error reply (e.g. WRONGTYPE on one key) concerns that request only: it is answered by its failure mode
and the breaker stays closed. Settlement goes to the limiter that admitted the request; spends are also
mirrored in-process, so a replica's local budget counters know what it spent.
"""

import dataclasses
import logging
import math
import time
from typing import Any, Literal

from redis import exceptions as errors

from core.errors import OpenAIError
from policies.metrics import REDIS_BREAKER_OPEN, REDIS_FAILURES
from policies.ratelimit.buckets import Bucket, Decision, Held, Limiter, Replayed, Spend
from policies.ratelimit.replicas import ReplicaCount
from routing.breaker import CLOSED, OPEN, CircuitBreaker

log = logging.getLogger(__name__)
FailureMode = Literal["open", "closed"]
_CANNOT_SERVE = (errors.AuthenticationError, errors.BusyLoadingError, errors.ClusterDownError,
                 errors.NoPermissionError, errors.OutOfMemoryError, errors.ReadOnlyError,
                 errors.TryAgainError)  # fmt: skip
_FAILURES = (errors.RedisError, OSError, TimeoutError)
_REFUSED = (errors.AuthenticationError, errors.NoPermissionError)
_REFUSED_NAMES = tuple(e.__name__ + ":" for e in _REFUSED)
MAX_REPLAYED = 100_000
_CANNOT_SERVE_PREFIXES = ("BUSY", "MISCONF", "NOREPLICAS", "OOM", "READONLY", "LOADING", "MASTERDOWN")


def unavailable(error: BaseException) -> bool:
    """Does this error say Redis cannot serve anyone (as opposed to a problem with one request's keys)?"""
    if isinstance(error, (*_CANNOT_SERVE, OSError, TimeoutError)):
        return True
    if isinstance(error, errors.ResponseError):
        return str(error).startswith(_CANNOT_SERVE_PREFIXES)
    return isinstance(error, errors.RedisError)  # connection, timeout, protocol


class FailoverLimiter:
    def __init__(
        self,
        primary: Limiter,
        fallback: Limiter,
        mode: FailureMode,
        retry_s: float,
        replicas: ReplicaCount | None = None,
    ) -> None:
        self._primary = primary
        self._fallback = fallback
        self._mode = mode
        self._retry_s = retry_s
        self._breaker = CircuitBreaker(1, retry_s, on_change=_export_state)  # opens on the first failure
        self._replicas = replicas or ReplicaCount(None, "", 1, 1.0)
        self._admitted_by: dict[str, Limiter] = {}
        self._outage: dict[str, Replayed] = {}  # admitted locally, to replay into Redis on its return
        self._last_error: BaseException | None = None  # the last failure that opened the breaker

    async def admit(self, member: str, buckets: list[Bucket], failure_mode: str | None = None) -> Decision:
        mode = failure_mode or self._mode
        if self._breaker.available():
            self._breaker.on_dispatch()
            try:
                await self._replay()  # confirmed before this admission: the windows count them first
                decision = await self._primary.admit(member, buckets)
            except _FAILURES as exc:
                self._failed("admit", mode, exc)
            else:
                self._breaker.on_success()
                if decision.admitted:
                    self._admitted_by[member] = self._primary
                return decision
        if mode == "closed":
            raise self._unavailable()
        decision = await self._fallback.admit(member, [self._share(b) for b in buckets])
        if decision.admitted:
            self._admitted_by[member] = self._fallback
            self._remember(Replayed(member, buckets, time.time()))
        return decision

    async def settle(self, member: str, buckets: list[Bucket], tokens: int, spends: list[Spend]) -> None:
        by_primary = self._admitted_by.pop(member, self._primary) is self._primary
        if (outage := self._outage.get(member)) is not None:
            outage.tokens = tokens
        if spends or not by_primary:  # (a no-op otherwise)
            await self._fallback.settle(member, [] if by_primary else buckets, tokens, spends)
        if by_primary or self._breaker.state == CLOSED:  # spends reach Redis whoever admitted
            await self._primary.settle(member, buckets if by_primary else [], tokens, spends)

    async def renew(self, held: list[Held]) -> None:
        await self._fallback.renew([h for h in held if self._admitted_by.get(h[0]) is self._fallback])
        ours = [h for h in held if self._admitted_by.get(h[0]) is self._primary]
        if ours and self._breaker.state != OPEN:
            try:
                await self._primary.renew(ours)
            except _FAILURES as exc:
                self._failed("renew", self._mode, exc)

    async def drain(self) -> None:
        await self._primary.drain()
        await self._fallback.drain()

    async def aclose(self) -> None:
        await self._replicas.aclose()
        await self._primary.aclose()
        await self._fallback.aclose()

    async def seed_spend(self, spends: list[Spend]) -> None:
        await self._fallback.seed_spend(spends)
        try:
            await self._primary.seed_spend(spends)
        except _FAILURES as exc:
            self._failed("seed", self._mode, exc)

    async def _replay(self) -> None:
        """Writes the outage's local admissions into Redis's windows, and forgets them once Redis confirmed.
        Raises while Redis is unavailable (they are kept for the next try); entries Redis refuses one by one
        (e.g. WRONGTYPE on a key) are dropped, as their own requests' errors were."""
        if not self._outage:
            return
        replayed = list(self._outage.values())
        try:
            await self._primary.replay(replayed)
        except _FAILURES as exc:
            if unavailable(exc):
                raise
            REDIS_FAILURES.labels(operation="replay", mode="dropped").inc()
            log.warning("rate limiting: %d replayed admissions refused by Redis (%s)", len(replayed), exc)
        for entry in replayed:
            self._outage.pop(entry.member, None)

    def _remember(self, admitted: Replayed) -> None:
        self._outage[admitted.member] = admitted
        if len(self._outage) > MAX_REPLAYED:  # a long outage: the oldest would have left the window first
            del self._outage[next(iter(self._outage))]

    def _share(self, bucket: Bucket) -> Bucket:
        replicas = self._replicas()
        if replicas <= 1:
            return bucket
        share = bucket.limit / replicas
        if bucket.kind in ("requests", "concurrency"):
            share = max(1, math.floor(share)) if bucket.limit >= 1 else 0
        return dataclasses.replace(bucket, limit=share)

    def readiness(self) -> dict[str, Any]:
        """For /health/ready: `redis` is "ok", "unavailable" (down, or cannot serve) or "refused" (credentials
        or ACL rights refused: waiting will not mend it). Ready unless refused, or unavailable while the
        default failure mode is closed (every request would be refused)."""
        shared: dict[str, Any] = getattr(self._primary, "readiness", dict)()
        connected = shared.get("connected", True)
        if self._breaker.state == CLOSED and connected:
            state = "ok"
        elif isinstance(self._last_error, _REFUSED) and self._breaker.state != CLOSED:
            state = "refused"
            shared.setdefault("problem", f"{type(self._last_error).__name__}: {self._last_error}")
        elif "problem" in shared and shared["problem"].startswith(_REFUSED_NAMES):
            state = "refused"
        else:
            state = "unavailable"
        ready = state == "ok" or (state == "unavailable" and self._mode == "open")
        return {"ready": ready, "redis": state, "breaker": self._breaker.state, "failure_mode": self._mode,
                "replicas": self._replicas(), **shared}  # fmt: skip

    def _unavailable(self) -> OpenAIError:
        retry = max(1, math.ceil(self._retry_s))
        return OpenAIError(
            503,
            "Rate limiting is temporarily unavailable; please retry shortly.",
            code="rate_limit_unavailable",
            headers={"retry-after": str(retry)},
        )

    def _failed(self, operation: str, mode: str, exc: BaseException) -> None:
        REDIS_FAILURES.labels(operation=operation, mode=mode).inc()
        if not unavailable(exc):  # this request's keys, not Redis: the breaker stays closed
            self._breaker.on_success()
            log.error("rate limiting: Redis refused %s (%s: %s)", operation, type(exc).__name__, exc)
            return
        was_closed = self._breaker.state == CLOSED
        self._last_error = exc
        self._breaker.on_failure()
        if was_closed and self._breaker.state == OPEN:
            log.warning("rate limiting: Redis unavailable during %s (%s: %s); fail-%s per policy",
                        operation, type(exc).__name__, exc, self._mode)  # fmt: skip


def _export_state(state: str) -> None:
    REDIS_BREAKER_OPEN.set(state != CLOSED)
