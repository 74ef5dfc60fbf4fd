"""Metrics and the access log for every request: the observe stage and the factory that builds it.

`ObserveStage` goes FIRST in the stage list, so it sees every request that reaches the pipeline. Errors of
inner stages pass through it as exceptions: it records them and re-raises. Requests the HTTP layer refuses
before the pipeline (a missing or bad key, a malformed body) reach it through `rejected`. For streams a tap on the reply
times the first token and the gaps between tokens, and its end hook settles at the stream's end (normal
end, error, or the client going away).

The route stage (routing/stage.py, the one that calls deployments) adds the time spent in it to the
request's upstream clock, ctx.upstream. For streams it awaits the first upstream chunk before it returns,
so the time measured is the time to that chunk.

Gateway overhead, precisely: from the request's arrival (ctx.started_at, set by the HTTP middleware) to the
moment the pipeline hands the answer to the HTTP layer (the whole JSON body; for streams, the first chunk),
minus the upstream clock (route stage time: whole calls including retries, or time to the first streamed
chunk). It is recorded for successful requests that reached the route stage; answers without an upstream
call (cache hits) show in llmgw_request_duration_seconds{cache_status=...} instead.
"""

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from core.context import Handler, RequestContext
from core.errors import OpenAIError
from core.reply import Ending, Reply
from core.sse import has_token
from gateway.access_log import AccessLog, chunk_text, configure_access_logger, response_text
from gateway.metrics import GatewayMetrics, Outcome, observability_settings, render_metrics
from gateway.settings import Settings

Clock = Callable[[], float]
CANCELLED = "cancelled"


@dataclass
class _StreamTiming:
    first_chunk: float | None = None
    first_token: float | None = None
    last_token: float | None = None


class ObserveStage:
    def __init__(self, metrics: GatewayMetrics, access_log: AccessLog, clock: Clock = time.perf_counter):
        self._metrics = metrics
        self._log = access_log
        self._clock = clock

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        started = ctx.started_at or self._clock()
        self._metrics.request_started(ctx)
        try:
            reply = await call_next(ctx)
        except BaseException as exc:
            self._finish(ctx, started, _status_of(exc), error=_error_text(exc))
            raise
        if reply.stream is not None:
            await self._observe_stream(ctx, started, reply)
            return reply
        text = response_text(reply.body) if self._log.wants_bodies else None
        self._finish(ctx, started, reply.status, first_byte=self._clock(), text=text)
        return reply

    def rejected(self, ctx: RequestContext, error: OpenAIError) -> None:
        """A request refused before the pipeline ran (no key or a bad one, a malformed or too large body):
        counted and logged like the rest (model label "other": the body was not read or not valid)."""
        self._metrics.request_started(ctx)
        self._finish(ctx, ctx.started_at or self._clock(), error.status, error=_error_text(error))

    async def _observe_stream(self, ctx: RequestContext, started: float, reply: Reply) -> None:
        timing, texts = _StreamTiming(), ([] if self._log.wants_bodies else None)
        reply.taps.append(partial(self._on_chunk, ctx, timing, texts))

        def finish(ending: Ending) -> None:
            status = CANCELLED if ending.cancelled else ending.status
            ttft = None if timing.first_token is None else timing.first_token - started
            text = None if texts is None else "".join(texts)
            error = None if ending.error is None else _error_text(ending.error)
            self._finish(
                ctx, started, status, first_byte=timing.first_chunk, ttft=ttft, error=error, text=text
            )

        await reply.on_end(finish)

    def _on_chunk(
        self, ctx: RequestContext, timing: _StreamTiming, texts: list[str] | None, chunk: dict[str, Any]
    ) -> None:
        now = self._clock()
        if timing.first_chunk is None:
            timing.first_chunk = now
        if has_token(chunk):
            if timing.last_token is None:
                timing.first_token = now
            else:
                self._metrics.inter_token(ctx, now - timing.last_token)
            timing.last_token = now
        if texts is not None:
            texts.append(chunk_text(chunk))

    def _finish(
        self,
        ctx: RequestContext,
        started: float,
        status: int | str,
        *,
        first_byte: float | None = None,
        ttft: float | None = None,
        error: str | None = None,
        text: str | None = None,
    ) -> None:
        outcome = Outcome(status, self._clock() - started, ttft, _overhead(ctx, started, status, first_byte))
        self._metrics.request_finished(ctx, outcome)
        self._log.write(ctx, outcome, error, text)


def _overhead(
    ctx: RequestContext, started: float, status: int | str, first_byte: float | None
) -> float | None:
    clock = ctx.upstream
    if first_byte is None or not clock.calls or status != 200:
        return None
    return first_byte - started - clock.waited_s


def _status_of(exc: BaseException) -> int | str:
    if isinstance(exc, OpenAIError):
        return exc.status
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return CANCELLED
    return 500


def _error_text(exc: BaseException) -> str | None:
    if isinstance(exc, OpenAIError):
        return f"{exc.type}: {exc.message}"
    return None if isinstance(exc, asyncio.CancelledError | GeneratorExit) else type(exc).__name__


@dataclass
class Observability:
    """What the app needs: the stage, and the /metrics body."""

    metrics: GatewayMetrics
    stage: ObserveStage

    def render(self) -> tuple[bytes, str]:
        return render_metrics(self.metrics)


def create_observability(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    log_stream: TextIO = sys.stdout,
    logger: logging.Logger | None = None,
) -> Observability:
    metrics = GatewayMetrics.from_settings(settings, registry)
    access_log = AccessLog(observability_settings(settings), logger or configure_access_logger(log_stream))
    return Observability(metrics, ObserveStage(metrics, access_log))
