"""The request pipeline, top to bottom. Each stage lives in its own package; this file only orders them.

observe (metrics, access log)          gateway/observe.py
authenticate key → principal           policies/
resolve the tenant's policy            policies/
rate limits and budget                 policies/
exact prompt cache                     cache/
semantic cache                         cache/
cascade small → large                  routing/
account tokens and cost                gateway/accounting.py
route and call a deployment            routing/, backends/
"""

from collections.abc import Callable, Sequence

from gateway.context import Handler, Reply, RequestContext, Stage
from gateway.errors import OpenAIError


async def _nobody_answered(ctx: RequestContext) -> Reply:
    raise OpenAIError(500, "The pipeline ended without an answer.")


def chain(stages: Sequence[Stage], around: Callable[[Stage], Stage] | None = None) -> Handler:
    """Fold the stages into one handler: stage[0] runs first and sees the final reply last.

    `around` wraps each stage (tracing: a span per stage); None adds nothing to the hot path."""
    handler: Handler = _nobody_answered
    for stage in reversed(stages):
        handler = _bind(around(stage) if around else stage, handler)
    return handler


def _bind(stage: Stage, call_next: Handler) -> Handler:
    async def handle(ctx: RequestContext) -> Reply:
        return await stage(ctx, call_next)

    return handle
