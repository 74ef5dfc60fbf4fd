"""Accounting: one usage record per authenticated request, written when its reply has ended.

The record carries the final status, the request's total usage (a cascade's attempts summed) and cost.
Each attempt is priced where it is made, at its deployment's prices (routing/stage.py, core.models.cost_usd);
this stage sits right below the limits, so it sees every request they admitted, cut or failed ones too.
"""

import time
from typing import Any

from core.context import Handler, RequestContext
from core.errors import OpenAIError
from core.reply import Reply
from policies.tables import utcnow
from policies.usage_writer import UsageWriter


class AccountingStage:
    """Writes the usage record of every authenticated request when its reply has ended."""

    def __init__(self, usage: UsageWriter) -> None:
        self._usage = usage

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        try:
            reply = await call_next(ctx)
        except BaseException as exc:
            self._record(ctx, exc.status if isinstance(exc, OpenAIError) else 500)
            raise
        await reply.on_end(lambda ending: self._record(ctx, ending.status))
        return reply

    def _record(self, ctx: RequestContext, status: int) -> None:
        if ctx.principal is not None:
            self._usage.submit(usage_record(ctx, status))


def usage_record(ctx: RequestContext, status: int) -> dict[str, Any]:
    assert ctx.principal is not None
    latency = (time.perf_counter() - ctx.started_at) * 1000 if ctx.started_at else 0.0
    return {
        "ts": utcnow(),
        "request_id": ctx.request_id,
        "tenant_id": ctx.principal.tenant_id,
        "key_id": ctx.principal.key_id,
        "model": ctx.model,
        "deployment": ctx.deployment,
        "endpoint": ctx.endpoint,
        "status": status,
        "prompt_tokens": ctx.usage.prompt_tokens,
        "completion_tokens": ctx.usage.completion_tokens,
        "cached_tokens": ctx.usage.cached_tokens,
        "cost_usd": ctx.cost_usd,
        "latency_ms": latency,
        "cache_status": ctx.cache_status,
    }
