"""What the route stage and the backends need of tracing: a span per upstream attempt, `traceparent` out.

Off, it costs a field read per attempt: `ctx.tracer` is None and no span is made. gateway/tracing.py
turns it on (the SDK, the exporter, the span per stage); this module needs only opentelemetry-api.
"""

import contextlib
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import propagate, trace

from core.context import RequestContext

_UNTRACED = contextlib.nullcontext()
_enabled = False  # any app in this process traces: backends then add traceparent to upstream calls


def enable() -> None:
    global _enabled
    _enabled = True


def attempt_span(
    ctx: RequestContext, deployment: str, alias: str, attempt: int
) -> AbstractContextManager[Any]:
    """A span around one backend attempt (a shared no-op when the request is not traced)."""
    if ctx.tracer is None:
        return _UNTRACED
    attributes = {"llmgw.deployment": deployment, "llmgw.model": alias, "llmgw.attempt": attempt,
                  "llmgw.retry": attempt > 0}  # fmt: skip
    return ctx.tracer.start_as_current_span(
        "backend.attempt", kind=trace.SpanKind.CLIENT, attributes=attributes
    )


def queue_span(ctx: RequestContext, alias: str) -> AbstractContextManager[Any]:
    """A span around the wait for a slot of the alias's pool (admission; a no-op when not traced)."""
    if ctx.tracer is None:
        return _UNTRACED
    return ctx.tracer.start_as_current_span("admission.queue", attributes={"llmgw.model": alias})


def inject(headers: dict[str, str]) -> None:
    """Add the current span's `traceparent` to an upstream request's headers (when tracing is on)."""
    if _enabled:
        propagate.inject(headers)
