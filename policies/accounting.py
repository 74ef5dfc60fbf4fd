"""Accounting: what each upstream attempt cost, and the request's usage record.

Two stages, at two places in the stage list (gateway/services.py):
- `AccountingStage`, right above the route stage, prices each attempt at the serving deployment's prices
  when its reply has ended (ctx.cost_usd accumulates: a cascade's attempts are priced each at their own);
- `UsageRecordStage`, right below the limits, writes one usage record per authenticated request when the
  reply has ended, with the final status, the request's total usage and cost.
"""

import time
from typing import Any

from core.context import Handler, RequestContext
from core.errors import OpenAIError
from core.models import ModelConfig, cost_usd
from core.reply import Reply
from policies.tables import utcnow
from policies.usage_writer import UsageWriter


class AccountingStage:
    def __init__(self, models: list[ModelConfig]) -> None:
        self.set_models(models)

    def set_models(self, models: list[ModelConfig]) -> None:
        self._deployments = {d.name: d for m in models for d in m.deployments}

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        reply = await call_next(ctx)
        await reply.on_end(lambda _: self._charge(ctx))
        return reply

    def _charge(self, ctx: RequestContext) -> None:
        deployment = self._deployments.get(ctx.deployment or "")
        if deployment:
            ctx.cost_usd += cost_usd(deployment, ctx.usage.prompt_tokens, ctx.usage.completion_tokens)


class UsageRecordStage:
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

