"""A backend's answer, and the one way to act when it has ended.

A reply is a JSON body or a stream of OpenAI chunk objects. Stages that must act at its end (cost, usage
records, rate-limit settlement, metrics, traces, the cache's store) call `await reply.on_end(hook)`:
the hook runs once with the final `Ending` (status, usage, error), at once for a body, when the stream
ends for a stream. Hooks run in the order they were added, so an inner stage's hook runs before the
outer stages' (accounting has priced the tokens before the limits settle them). Stages that must see
each chunk as it goes out (timings, the cache's copy of the answer) add a tap: `reply.taps.append(f)`.

The stream is read through one wrapper (`_drive`) that counts usage, calls the taps and runs the hooks,
however the stream ends: normally (200), with an OpenAIError (its status), with another error (500),
cancelled or closed early (499), or dropped unread (499, from a finaliser), so a concurrency slot can
never leak until its lease expires. An async generator, with a finaliser for the unread case: as fast
per chunk as a class with `__anext__` (0.71 vs 0.72 µs, studies/README.md, "One end-of-reply hook").
"""

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from core.errors import OpenAIError
from core.usage import Usage

log = logging.getLogger("llmgw.reply")
CLIENT_CLOSED = 499  # the client left, or a stage closed the stream before its end
Chunk = dict[str, Any]


@dataclass(frozen=True)
class Ending:
    """How a reply ended."""

    status: int  # 200, an error's status, 500 for other errors, CLIENT_CLOSED when cut short
    usage: Usage  # what this reply consumed: its usage chunk or body, else the chunks produced
    error: BaseException | None = None

    @property
    def cancelled(self) -> bool:
        return self.status == CLIENT_CLOSED


EndHook = Callable[[Ending], Awaitable[None] | None]
Tap = Callable[[Chunk], None]


class Reply:
    def __init__(
        self,
        body: dict[str, Any] | None = None,
        stream: AsyncIterator[Chunk] | None = None,
        status: int = 200,
        headers: dict[str, str] | None = None,
        usage: Usage | None = None,
    ) -> None:
        self.body = body
        self.status = status
        self.headers = headers if headers is not None else {}
        self.hooks: list[EndHook] = []
        self.taps: list[Tap] = []
        self._usage = usage or Usage()
        self._tally: _Tally | None = None
        self.stream: AsyncIterator[Chunk] | None = None
        if stream is not None:
            self._tally = _Tally(self.hooks)
            self.stream = _drive(stream, self._tally, self.taps)
            weakref.finalize(self.stream, self._tally.end_unread)

    @property
    def usage(self) -> Usage:
        return self._usage if self._tally is None else self._tally.usage

    async def on_end(self, hook: EndHook) -> None:
        """Run `hook` once this reply has ended: now for a body, when the stream ends for a stream."""
        if self._tally is None:
            result = hook(Ending(self.status, self._usage))
            if result is not None:
                await result
        else:
            self.hooks.append(hook)


class _Tally:
    """A stream's usage so far, and the hooks still to run (None once they have run)."""

    def __init__(self, hooks: list[EndHook]) -> None:
        self.usage = Usage()
        self.produced = 0  # content chunks: a stream cut before its usage chunk still settles them
        self.hooks: list[EndHook] | None = hooks
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def _ending(self, status: int, error: BaseException | None) -> Ending:
        if not self.usage.completion_tokens:
            self.usage.completion_tokens = self.produced
        return Ending(status, self.usage, error)

    async def end(self, status: int, error: BaseException | None) -> None:
        hooks, self.hooks = self.hooks, None
        if hooks:
            await _run(hooks, self._ending(status, error))

    def end_unread(self) -> None:
        """The stream was dropped without being read (a started one ends in `_drive`'s finally)."""
        hooks, self.hooks = self.hooks, None
        if hooks and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_spawn, self._loop, hooks, self._ending(CLIENT_CLOSED, None))


async def _drive(chunks: AsyncIterator[Chunk], tally: _Tally, taps: list[Tap]) -> AsyncIterator[Chunk]:
    status, error = CLIENT_CLOSED, None  # closed early (aclose) unless it ends otherwise
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                if chunk.get("usage"):  # inline, not a method: this loop runs per chunk, per reply layer
                    tally.usage = Usage.from_openai(chunk["usage"])
                elif chunk.get("choices"):
                    tally.produced += 1
                for tap in taps:
                    tap(chunk)
                yield chunk
        status = 200
    except OpenAIError as exc:
        status, error = exc.status, exc
        raise
    except asyncio.CancelledError as exc:
        error = exc
        raise
    except Exception as exc:
        status, error = 500, exc
        raise
    finally:
        await tally.end(status, error)


async def _run(hooks: list[EndHook], ending: Ending) -> None:
    """Every hook of a stream runs, even when one fails or the task is cancelled meanwhile (then re-raised):
    a stream ends inside the SSE writer, where nobody above could still act on a hook's failure."""
    cancelled = False
    for hook in hooks:
        try:
            result = hook(ending)
            if result is not None:
                await asyncio.shield(result)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:
            log.exception("an end-of-reply hook failed")
    if cancelled:
        raise asyncio.CancelledError


def _spawn(loop: asyncio.AbstractEventLoop, hooks: list[EndHook], ending: Ending) -> None:
    loop.create_task(_run(hooks, ending))


async def prepend(first: Chunk | None, rest: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """`first` (already read, e.g. to time the first byte), then the rest; nothing when first is None."""
    async with aclosing(rest):
        if first is not None:
            yield first
            async for chunk in rest:
                yield chunk
