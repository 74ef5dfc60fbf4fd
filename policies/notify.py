"""Change propagation: a change on one replica reaches every replica's Directory within ~1 s.

With Redis: publish on a channel; every replica listens and reloads. A periodic reload is the
backstop (missed messages, Redis outages, replicas without Redis). A reload that fails after a change
message (a locked SQLite file, a database failover) is retried within a second, not left to the backstop.
"""

import asyncio
import logging
from contextlib import suppress

from redis.asyncio import Redis
from redis.exceptions import RedisError

from policies.directory import Directory

log = logging.getLogger(__name__)

RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4)  # then every RETRY_DELAYS_S[-1] until a reload succeeds


class ChangeNotifier:
    def __init__(self, directory: Directory, redis: Redis | None, channel: str, refresh_s: float) -> None:
        self._directory = directory
        self._redis = redis
        self._channel = channel
        self._refresh_s = refresh_s
        self._tasks: list[asyncio.Task] = []
        self.subscribed = asyncio.Event()

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._refresh_forever(), name="policies-refresh"))
        if self._redis is not None:
            self._tasks.append(asyncio.create_task(self._listen_forever(), name="policies-listen"))

    async def changed(self) -> None:
        """Call after a committed change: reload here, then tell the other replicas."""
        await self._directory.reload()
        if self._redis is None:
            return
        try:
            await self._redis.publish(self._channel, "reload")
        except (RedisError, OSError) as exc:
            log.warning(
                "could not publish a policy change (%s); replicas catch up on refresh", type(exc).__name__
            )

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with suppress(asyncio.CancelledError):
                await task

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            await self._reload_logged()

    async def _listen_forever(self) -> None:
        while True:
            try:
                await self._listen()
            except (RedisError, OSError) as exc:
                self.subscribed.clear()
                log.warning("policy change listener lost Redis (%s); retrying", type(exc).__name__)
                await asyncio.sleep(1.0)

    async def _listen(self) -> None:
        assert self._redis is not None
        async with self._redis.pubsub() as pubsub:
            await pubsub.subscribe(self._channel)
            self.subscribed.set()
            await self._reload_until_done()  # catch up on anything missed while unsubscribed
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    await self._reload_until_done()

    async def _reload_until_done(self) -> None:
        """A change was announced: keep the previous view only until a reload succeeds."""
        attempt = 0
        while not await self._reload_logged():
            await asyncio.sleep(RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)])
            attempt += 1

    async def _reload_logged(self) -> bool:
        try:
            await self._directory.reload()
        except Exception:
            log.exception("reloading keys and policies failed; keeping the previous view")
            return False
        return True
