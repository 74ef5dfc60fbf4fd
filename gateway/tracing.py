"""OpenTelemetry traces: one trace per request, a span per pipeline stage and per backend attempt.

Off by default, at no cost: the pipeline is then built without any wrapper, and the route stage and the
backends only look up `ctx.tracer` / a module flag (core/tracing.py). On, an incoming W3C `traceparent` becomes
the parent of the request's trace, and each upstream call carries the attempt span's `traceparent`.
The SDK (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http: the `tracing` extra) is imported
only when tracing is on.
"""

from collections.abc import Sequence
from typing import Any

from opentelemetry import context, propagate, trace

from core import tracing as core_tracing
from core.context import Handler, RequestContext, Stage
from core.reply import Reply
from gateway.pipeline import chain
from gateway.tracing_config import TracingSettings

_SPAN_NAMES = {"ObserveStage": "observe", "DrainStage": "drain", "AuthStage": "auth", "PolicyStage": "policy",
               "RateLimitStage": "limits", "AccountingStage": "accounting", "ExactCacheStage": "exact_cache",
               "SemanticCacheStage": "semantic_cache", "CascadeStage": "cascade", "RouteStage": "route"}  # fmt: skip


class Tracing:
    """The tracer of one app, and its provider (tests add an in-memory exporter to it)."""

    def __init__(self, settings: TracingSettings) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        core_tracing.enable()
        self.provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
        if settings.exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint))
            )
        self.tracer = self.provider.get_tracer("llmgw")

    def stage(self, stage: Stage) -> Stage:
        """The stage, inside a span named after it."""
        name = _SPAN_NAMES.get(type(stage).__name__, type(stage).__name__)

        async def traced(ctx: RequestContext, call_next: Handler) -> Reply:
            with self.tracer.start_as_current_span(name):
                return await stage(ctx, call_next)

        return traced

    def request(self, handler: Handler) -> Handler:
        """The whole pipeline in one root span, child of the caller's traceparent; it ends with the stream."""

        async def traced(ctx: RequestContext) -> Reply:
            parent = propagate.extract(ctx.headers)
            root = self.tracer.start_span(f"llmgw {ctx.endpoint}", context=parent, kind=trace.SpanKind.SERVER)
            token = context.attach(trace.set_span_in_context(root, parent))
            ctx.tracer = self.tracer
            try:
                reply = await handler(ctx)
            except Exception as error:
                _finish(root, ctx, getattr(error, "status", 500))
                raise
            finally:
                context.detach(token)
            await reply.on_end(lambda ending: _finish(root, ctx, ending.status))
            return reply

        return traced

    def rejected(self, ctx: RequestContext, status: int) -> None:
        """A request refused before the pipeline (its key, its body): a root span of its own, marked so."""
        parent = propagate.extract(ctx.headers)
        span = self.tracer.start_span(f"llmgw {ctx.endpoint}", context=parent, kind=trace.SpanKind.SERVER,
                                      attributes={"llmgw.rejected": True})  # fmt: skip
        _finish(span, ctx, status)

    def pipeline(self, stages: Sequence[Stage]) -> Handler:
        return self.request(chain(stages, self.stage))

    async def aclose(self) -> None:
        self.provider.shutdown()


def _finish(span: Any, ctx: RequestContext, status: int) -> None:
    span.set_attributes({"llmgw.request_id": ctx.request_id, "llmgw.model": ctx.model,
                         "llmgw.endpoint": ctx.endpoint, "llmgw.stream": ctx.stream,
                         "llmgw.cache_status": ctx.cache_status, "llmgw.deployment": ctx.deployment or "",
                         "llmgw.prompt_tokens": ctx.usage.prompt_tokens,
                         "llmgw.completion_tokens": ctx.usage.completion_tokens,
                         "http.response.status_code": status})  # fmt: skip
    if status >= 500:
        span.set_status(trace.StatusCode.ERROR)
    span.end()


def create_tracing(settings: TracingSettings) -> Tracing | None:
    return Tracing(settings) if settings.enabled else None
