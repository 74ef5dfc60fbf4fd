"""The request pipeline as one handler: a fold of the stages (Starlette-style middleware).

The stage list itself is written once, in gateway/services.py (`_stages`), with what each stage does.
"""

from collections.abc import Awaitable, Callable, Sequence

from core.context import Handler, RequestContext, Stage
from core.errors import OpenAIError
from core.reply import Reply


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
    """A plain function handing back the stage's coroutine: no coroutine of its own, so a request's await
    chain is one frame per stage, not two (every resumption walks the whole chain)."""

    def handle(ctx: RequestContext) -> Awaitable[Reply]:
        return stage(ctx, call_next)

    return handle
