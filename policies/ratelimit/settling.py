"""A reply stream that settles its admission exactly once, however the stream ends.

Normal end → 200; an OpenAIError → its status; cancellation or aclose() → 499 (what was produced is
in ctx.usage); and a stream dropped without ever being iterated (the client left before the first
byte) settles from its finaliser, so a concurrency slot can never leak until its lease expires.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from gateway.errors import OpenAIError

CLIENT_CLOSED = 499
Settle = Callable[[int], Awaitable[None]]


class SettlingStream:
    def __init__(self, chunks: AsyncIterator[dict[str, Any]], settle: Settle) -> None:
        self._chunks = chunks
        self._settle: Settle | None = settle
        self._loop = asyncio.get_running_loop()

    def __aiter__(self) -> "SettlingStream":
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            await self._finish(200)
            raise
        except OpenAIError as exc:
            await self._finish(exc.status)
            raise
        except BaseException as exc:
            await self._finish(CLIENT_CLOSED if isinstance(exc, asyncio.CancelledError) else 500)
            raise

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._chunks, "aclose", None)
            if aclose is not None:
                await aclose()  # inner stages account for what was produced first
        finally:
            await self._finish(CLIENT_CLOSED)

    async def _finish(self, status: int) -> None:
        settle, self._settle = self._settle, None
        if settle is not None:
            await asyncio.shield(settle(status))

    def __del__(self) -> None:
        settle, self._settle = self._settle, None
        if settle is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_spawn, self._loop, settle)


def _spawn(loop: asyncio.AbstractEventLoop, settle: Settle) -> None:
    loop.create_task(settle(CLIENT_CLOSED))
