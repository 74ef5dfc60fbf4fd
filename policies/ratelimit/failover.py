"""Redis first; while Redis is unreachable, per-replica limits (fail-open) or 503 (fail-closed).

After a failure the fallback answers for `retry_s`, then Redis is tried again: recovery needs no
operator. Settlement goes to the limiter that admitted the request (remembered per member until
then; every admitted request is settled by the rate-limit stage).
"""

import logging
import time
from typing import Literal

from redis.exceptions import RedisError

from gateway.errors import OpenAIError
from policies.metrics import REDIS_FAILURES
from policies.ratelimit.buckets import Bucket, Decision, Limiter, Spend

log = logging.getLogger(__name__)
_FAILURES = (RedisError, OSError, TimeoutError)


class FailoverLimiter:
    def __init__(
        self, primary: Limiter, fallback: Limiter, mode: Literal["open", "closed"], retry_s: float
    ) -> None:
        self._primary = primary
        self._fallback = fallback
        self._mode = mode
        self._retry_s = retry_s
        self._down_until = 0.0
        self._admitted_by: dict[str, Limiter] = {}

    async def admit(self, member: str, buckets: list[Bucket]) -> Decision:
        limiter, decision = self._primary, None
        if time.monotonic() >= self._down_until:
            try:
                decision = await self._primary.admit(member, buckets)
            except _FAILURES as exc:
                self._mark_down("admit", exc)
        if decision is None:
            limiter, decision = self._fallback, await self._admit_fallback(member, buckets)
        if decision.admitted:
            self._admitted_by[member] = limiter
        return decision

    async def settle(self, member: str, buckets: list[Bucket], tokens: int, spends: list[Spend]) -> None:
        limiter = self._admitted_by.pop(member, self._primary)
        try:
            await limiter.settle(member, buckets, tokens, spends)
        except _FAILURES as exc:
            self._mark_down("settle", exc)
            await self._fallback.settle(member, [], tokens, spends)

    async def _admit_fallback(self, member: str, buckets: list[Bucket]) -> Decision:
        if self._mode == "closed":
            raise OpenAIError(
                503, "Rate limiting is unavailable; try again shortly.", code="ratelimit_unavailable"
            )
        return await self._fallback.admit(member, buckets)

    async def seed_spend(self, spends: list[Spend]) -> None:
        await self._fallback.seed_spend(spends)
        try:
            await self._primary.seed_spend(spends)
        except _FAILURES as exc:
            self._mark_down("seed", exc)

    def _mark_down(self, operation: str, exc: BaseException) -> None:
        REDIS_FAILURES.labels(operation=operation, mode=self._mode).inc()
        if time.monotonic() >= self._down_until:
            log.warning(
                "rate limiting: Redis unreachable during %s (%s); fail-%s for %.1fs",
                operation,
                type(exc).__name__,
                self._mode,
                self._retry_s,
            )
        self._down_until = time.monotonic() + self._retry_s
