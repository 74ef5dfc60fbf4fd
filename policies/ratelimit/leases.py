"""Keeps the leases of requests in flight alive: concurrency slots and budget reservations.

A lease lasts `lease_s` (≤ 30 s by default) and is renewed every third of it, in one limiter call for
every request in flight, for as long as the request (or its stream) runs. A replica that dies stops
renewing, so its slots free themselves within one lease length on every other replica.
"""

import asyncio
import contextlib
import logging

from policies.ratelimit.buckets import Bucket, Held, Limiter, holds_lease

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, limiter: Limiter, lease_s: float) -> None:
        self._limiter = limiter
        self._every_s = lease_s / 3
        self._held: dict[str, list[Bucket]] = {}
        self._task: asyncio.Task[None] | None = None

    def hold(self, member: str, buckets: list[Bucket]) -> None:
        leased = [bucket for bucket in buckets if holds_lease(bucket)]
        if not leased:
            return
        self._held[member] = leased
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def release(self, member: str) -> None:
        self._held.pop(member, None)

    def held(self) -> list[Held]:
        return list(self._held.items())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            if self._held:
                try:
                    await self._limiter.renew(self.held())
                except Exception:  # renewal retries on its next turn; a lease outlives two misses
                    log.exception("renewing %d rate-limit leases failed", len(self._held))
