"""A Lua script called by SHA over the limiter's pipelined connection (resp.py, cluster.py)."""

import asyncio
import hashlib
from typing import TYPE_CHECKING, Any

from redis.exceptions import AskError, MovedError, NoScriptError

if TYPE_CHECKING:
    from policies.ratelimit.resp import Pool


class LuaScript:
    """EVALSHA; the pool loads the script on each new connection, and when the server still does not
    know it (SCRIPT FLUSH) the call is repeated as EVAL, which caches it again: one more round trip,
    never a failed request."""

    def __init__(self, pool: "Pool", source: str) -> None:
        self._pool = pool
        self._source = source
        self._sha = hashlib.sha1(source.encode()).hexdigest()
        pool.preload(source)

    async def __call__(self, keys: list[str], args: list[Any]) -> Any:
        return await self._reply(self._pool.send("EVALSHA", self._sha, len(keys), *keys, *args), keys, args)

    def send(self, keys: list[str], args: list[Any], lazy: bool = False) -> "asyncio.Future[Any]":
        """Queues the call at once (see RespPool.send); the future resolves to its reply. No task is made:
        settlement sends one of these per request (lazy: sharing the next admission's round trip)."""
        parts = ("EVALSHA", self._sha, len(keys), *keys, *args)
        first = self._pool.send(*parts, lazy=lazy)
        result: asyncio.Future[Any] = first.get_loop().create_future()

        def evalsha_done(first: "asyncio.Future[Any]") -> None:
            error = None if first.cancelled() else first.exception()
            again = None
            if isinstance(error, NoScriptError):
                again = self._pool.send("EVAL", self._source, len(keys), *keys, *args)
            elif isinstance(error, MovedError | AskError):  # Redis Cluster: the slot is on another node
                again = self._pool.redirect(error, parts)
            if again is None:
                _copy(first, result)
            else:
                again.add_done_callback(lambda done: _copy(done, result))

        first.add_done_callback(evalsha_done)
        return result

    async def _reply(self, first: "asyncio.Future[Any]", keys: list[str], args: list[Any]) -> Any:
        try:
            return await first
        except NoScriptError:
            return await self._pool.send("EVAL", self._source, len(keys), *keys, *args)
        except (MovedError, AskError) as error:
            again = self._pool.redirect(error, ("EVALSHA", self._sha, len(keys), *keys, *args))
            if again is None:
                raise
            return await again


def _copy(source: "asyncio.Future[Any]", target: "asyncio.Future[Any]") -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())
