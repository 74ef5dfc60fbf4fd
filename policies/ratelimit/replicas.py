"""How many gateway replicas share the fleet's limits: each replica's share while Redis is away.

Fixed by a setting, or counted from a heartbeat set in Redis (each replica beats every `interval_s`;
one silent for three intervals is gone). The count used is the largest seen over those three intervals: a
Redis that restarts comes back with an empty set, and the first replica to beat would otherwise count itself
alone and, if Redis went away again, take the whole limit (an outside audit saw 15 of an rpm of 10 admitted
by two replicas). A smaller share is the safe side. While Redis is unreachable the last count stands.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from pathlib import Path

from redis.exceptions import RedisError

from policies.ratelimit.resp import Pool
from policies.ratelimit.script import LuaScript

log = logging.getLogger(__name__)
_SCRIPT = (Path(__file__).parent / "heartbeat.lua").read_text()


class ReplicaCount:
    def __init__(self, pool: Pool | None, key: str, fixed: int | None, interval_s: float) -> None:
        self.live = fixed or 1
        self._pool = pool
        self._beat = LuaScript(pool, _SCRIPT) if pool is not None and fixed is None else None
        self._key = key
        self._id = uuid.uuid4().hex
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._seen: deque[tuple[float, int]] = deque()  # (monotonic time, count) of recent beats

    def __call__(self) -> int:
        return self.live

    def start(self) -> None:
        if self._beat is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def beat(self) -> None:
        assert self._beat is not None
        gone_ms = round(self._interval_s * 3000)
        counted = max(1, int(await self._beat(keys=[self._key], args=[self._id, gone_ms])))
        now = time.monotonic()
        self._seen.append((now, counted))
        while self._seen and self._seen[0][0] < now - gone_ms / 1000:
            self._seen.popleft()
        self.live = max(count for _, count in self._seen)

    async def aclose(self) -> None:
        """Stop beating and leave the set, so the other replicas' shares grow at once."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        if self._pool is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._pool.call("ZREM", self._key, self._id)

    async def _run(self) -> None:
        while True:
            try:
                await self.beat()
            except (RedisError, OSError) as exc:  # Redis away: the last count stands
                log.debug("replica heartbeat failed: %s", exc)
            await asyncio.sleep(self._interval_s)
