"""Graceful shutdown of one gateway process.

On SIGTERM (or SIGINT) uvicorn stops accepting connections and waits for the open ones; this module
adds what uvicorn cannot know about:

- readiness fails at once (`Drain.draining`, read by /health/ready);
- requests and streams still running when the grace period (`shutdown_grace_s`) ends are cut:
  a request answers 503, a stream ends with an OpenAI-style error event (`DrainStage`);
- the lifespan shutdown that follows flushes the usage records;
- with several workers, the supervisor closes its copy of the listening socket at once, so new
  connections are refused instead of waiting in the kernel's backlog until the supervisor exits.
"""

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess

from core.context import Handler, RequestContext
from core.errors import OpenAIError
from core.reply import Reply

log = logging.getLogger("llmgw.lifecycle")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def shutting_down() -> OpenAIError:
    error = OpenAIError(503, "The gateway is shutting down and its grace period is over; please retry.",
                        code="server_shutting_down")  # fmt: skip
    error.headers["retry-after"] = "1"
    return error


async def close_within(closers: list[Callable[[], Awaitable[Any]]], timeout_s: float) -> None:
    """Runs each closer in turn (the lifespan shutdown: flush usage records, close pools and clients), all
    within `timeout_s` together. One that has not finished by then is abandoned with an error naming it, and
    the rest still run (each gets at least a second), so a stuck close (a peer that never answers) cannot
    keep a terminated process alive: an orchestrator would kill it later and lose every later flush."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    for close in closers:
        left = max(deadline - asyncio.get_running_loop().time(), 1.0)
        try:
            await asyncio.wait_for(close(), left)
        except TimeoutError:
            name = getattr(close, "__qualname__", repr(close))
            log.error("shutdown: %s did not finish within %.0fs; exiting without it", name, left)


class Drain:
    """The shutdown state of this process: draining from the signal on, expired at the grace period's end."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.draining = False
        self.expired = False
        self._running: set[asyncio.Task] = set()

    def begin(self) -> None:
        if self.draining:
            return
        self.draining = True
        log.info("shutting down: readiness fails now, in-flight work has %.0fs to finish", self.grace_s)
        asyncio.get_running_loop().call_later(self.grace_s, self._expire)

    def track(self, task: asyncio.Task) -> None:
        self._running.add(task)

    def untrack(self, task: asyncio.Task) -> None:
        self._running.discard(task)

    def _expire(self) -> None:
        self.expired = True
        if self._running:
            log.warning("grace period over: cutting %d request(s) still running", len(self._running))
        for task in list(self._running):
            task.cancel("grace period over")

    def hook_signals(self) -> Callable[[], None]:
        """Chain SIGTERM/SIGINT so they start the drain before the server's own handler runs.

        Returns the function that restores the previous handlers. Outside the main thread (tests
        that run the app in a thread) signals cannot be caught: call begin() instead.
        """
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        loop = asyncio.get_running_loop()
        previous = {sig: signal.getsignal(sig) for sig in SIGNALS}

        def on_signal(sig: int, frame: Any) -> None:
            loop.call_soon_threadsafe(self.begin)
            handler = previous[sig]
            if callable(handler):
                handler(sig, frame)

        for sig in SIGNALS:
            signal.signal(sig, on_signal)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore


class DrainStage:
    """Lets the drain cut a request or stream that outlives the grace period (first in the pipeline)."""

    def __init__(self, drain: Drain) -> None:
        self._drain = drain

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        task = asyncio.current_task()
        assert task is not None
        self._drain.track(task)
        try:
            reply = await call_next(ctx)
        except asyncio.CancelledError:
            self._drain.untrack(task)
            raise self._cut(task) from None
        except BaseException:
            self._drain.untrack(task)
            raise
        if reply.stream is None:
            self._drain.untrack(task)
            return reply
        # a new reply around the cut stream: the stages above see the 503, those below the cancellation
        return Reply(stream=self._stream(task, reply.stream), status=reply.status, headers=reply.headers)

    async def _stream(
        self, task: asyncio.Task, chunks: AsyncIterator[dict[str, Any]]
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            async with aclosing(chunks):
                async for chunk in chunks:
                    yield chunk
        except asyncio.CancelledError:
            raise self._cut(task) from None
        finally:
            self._drain.untrack(task)

    def _cut(self, task: asyncio.Task) -> BaseException:
        """The drain's own cancellation becomes a 503 / an error event; any other stays a cancellation."""
        if not self._drain.expired or not task.cancelling():
            return asyncio.CancelledError()
        task.uncancel()
        return shutting_down()


class WorkerSupervisor(Multiprocess):
    """uvicorn's supervisor of `--workers N`; on SIGTERM/SIGINT it also lets go of the listening socket
    (the workers close their own copies as their shutdown starts). `startup_failed`: a worker could not
    start, so the parent stopped (uvicorn's own exits 0 then)."""

    startup_failed = False

    def keep_subprocess_alive(self) -> None:
        super().keep_subprocess_alive()
        self.startup_failed |= any(process.exitcode == STARTUP_FAILURE for process in self.processes)

    def handle_term(self) -> None:
        self._close_listener()
        super().handle_term()

    def handle_int(self) -> None:
        self._close_listener()
        super().handle_int()

    def _close_listener(self) -> None:
        for sock in self.sockets:
            sock.close()
