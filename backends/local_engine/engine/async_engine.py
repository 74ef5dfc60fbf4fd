"""The engine loop on a background thread; requests are submitted and streamed from asyncio.

The loop thread owns the engine: callers only enqueue commands (add, abort), and the thread hands each
step's outputs back to the event loop. Closing a stream early (client disconnect) aborts the request,
which frees its KV blocks at the start of the next step.
"""

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backends.local_engine.engine.outputs import RequestOutput
from backends.local_engine.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from backends.local_engine.engine.llm_engine import LLMEngine
    from backends.local_engine.engine.sequence import Sequence

log = logging.getLogger("llmgw.engine")


@dataclass
class RequestTimes:
    """Wall-clock marks (time.monotonic) and counts of one request, for the metrics: vLLM's queue time is
    arrival to scheduled, prefill scheduled to first token, decode first to last token."""

    arrival: float = field(default_factory=time.monotonic)
    scheduled: float | None = None  # first left the waiting queue (None: never scheduled)
    first_token: float | None = None
    last_token: float | None = None
    max_tokens: int = 0  # the request's max_tokens parameter
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # so far

    def mark_tokens(self, now: float, output: RequestOutput) -> None:
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.num_prompt_tokens, self.num_output_tokens = output.num_prompt_tokens, output.num_output_tokens


class RequestObserver:
    """Told about each request's tokens as they are produced, and about each step (the metrics implement it)."""

    def on_tokens(self, times: RequestTimes, now: float, num_new: int) -> None:
        """Called before `times` is marked, so times.last_token is the previous delivery."""

    def on_finished(self, times: RequestTimes, now: float, reason: str) -> None: ...

    def on_step(self, num_tokens: int) -> None:
        """After a step that produced outputs: its tokens as vLLM counts an iteration's (the generated tokens,
        plus the prompt tokens of the requests that got their first token in it)."""

    def on_engine_step(self, scheduled: int, budget: int, seconds: float) -> None:
        """After every call of the engine's step: the tokens it scheduled (0 when it only emitted a step in
        flight), the step's token budget and the call's wall time."""


class RequestFailed(Exception):
    """The engine failed while preparing or stepping this request (a bug, not the client's input): the
    request ends with this error and the loop goes on serving the others."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue
    times: RequestTimes = field(default_factory=RequestTimes)
    seq_id: int | None = None
    seq: "Sequence | None" = None  # the engine's, for the time it was first scheduled

    def note_scheduled(self) -> None:
        if self.times.scheduled is None and self.seq is not None:
            self.times.scheduled = self.seq.first_scheduled

    def put(self, item: RequestOutput | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)


class AsyncEngine:
    def __init__(self, engine: "LLMEngine", observer: RequestObserver | None = None) -> None:
        self.engine = engine
        self._observer = observer or RequestObserver()
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[int, _Stream] = {}  # by seq_id; touched only on the loop thread
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # --- asyncio side ----------------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; ValueError for a request that can never fit."""
        if not self.alive:
            raise RuntimeError("the engine loop is not running")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._submit(lambda: self._add(stream, prompt_ids, params))
        finished = False
        try:
            while not finished:
                item = await stream.outputs.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self._submit(lambda: self._abort(stream))

    def _submit(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        self._wakeup.set()

    # --- loop thread -----------------------------------------------------------------------------------

    def _add(self, stream: _Stream, prompt_ids: list[int], params: SamplingParams) -> None:
        try:
            stream.seq_id = self.engine.add_request(prompt_ids, params)
        except ValueError as error:  # the client's: too long, a parameter out of range
            stream.put(error)
            return
        except Exception as error:
            log.exception("the engine failed to add a request")
            stream.put(_failure(error))
            return
        stream.seq, stream.times.max_tokens = self.engine.sequence(stream.seq_id), params.max_tokens
        self._streams[stream.seq_id] = stream

    def _abort(self, stream: _Stream) -> None:
        if stream.seq_id is not None and self._streams.pop(stream.seq_id, None) is not None:
            stream.note_scheduled()
            self.engine.abort(stream.seq_id)
            self._observer.on_finished(stream.times, time.monotonic(), "abort")

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._drain_commands()
                if self.engine.has_work:
                    self._step()
                else:
                    self._wakeup.wait(timeout=1.0)
                    self._wakeup.clear()
        except BaseException as error:  # a dead loop must fail requests, not hang them
            log.exception("engine loop crashed")
            self.error = error
            for stream in self._streams.values():
                stream.put(RuntimeError("the engine loop crashed"))

    def _step(self) -> None:
        """One engine step; when it raises, the requests of that step fail and the loop goes on."""
        scheduler = self.engine.scheduler
        scheduled, start = scheduler.scheduled_tokens, time.monotonic()
        try:
            outputs = self.engine.step()
        except Exception as error:
            log.exception("an engine step failed: failing its requests")
            for seq_id in self.engine.fail_step():
                if (stream := self._streams.pop(seq_id, None)) is not None:
                    stream.note_scheduled()
                    self._observer.on_finished(stream.times, time.monotonic(), "abort")
                    stream.put(_failure(error))
            return
        scheduled = scheduler.scheduled_tokens - scheduled  # 0 where the step only drained one in flight
        seconds = time.monotonic() - start
        self._observer.on_engine_step(scheduled, scheduler.max_num_batched_tokens, seconds)
        self._dispatch(outputs)

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        if outputs:
            prefilled = [o.num_prompt_tokens for o in outputs if o.num_output_tokens == len(o.new_token_ids)]
            self._observer.on_step(sum(len(o.new_token_ids) for o in outputs) + sum(prefilled))
        for output in outputs:
            stream = self._streams.get(output.seq_id)
            if stream is None:
                continue
            stream.note_scheduled()
            self._observer.on_tokens(stream.times, now, len(output.new_token_ids))
            stream.times.mark_tokens(now, output)
            if output.finished:
                del self._streams[output.seq_id]
                self._observer.on_finished(stream.times, now, output.finish_reason or "stop")
            stream.put(output)


def _failure(error: Exception) -> RequestFailed:
    """What the client of a failed request is told: the kind of failure; the log has the traceback."""
    return RequestFailed(
        f"The engine failed while processing this request ({type(error).__name__}); see the server log."
    )
