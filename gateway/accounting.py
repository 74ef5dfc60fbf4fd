"""Turns token usage into cost with the serving deployment's prices, when the reply has ended."""

from gateway.context import Handler, Reply, RequestContext, after_stream
from gateway.settings import DeploymentConfig, ModelConfig, Settings


class AccountingStage:
    def __init__(self, settings: Settings) -> None:
        self.set_models(settings.models)

    def set_models(self, models: list[ModelConfig]) -> None:
        self._deployments = {d.name: d for m in models for d in m.deployments}

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        reply = await call_next(ctx)
        if reply.stream is None:
            self._charge(ctx)
        else:
            reply.stream = after_stream(reply.stream, lambda: self._charge(ctx))
        return reply

    def _charge(self, ctx: RequestContext) -> None:
        deployment = self._deployments.get(ctx.deployment or "")
        if deployment:
            ctx.cost_usd += cost_usd(deployment, ctx.usage.prompt_tokens, ctx.usage.completion_tokens)


def cost_usd(deployment: DeploymentConfig, prompt_tokens: int, completion_tokens: int) -> float:
    return (
        prompt_tokens * deployment.input_price_per_1m + completion_tokens * deployment.output_price_per_1m
    ) / 1_000_000
