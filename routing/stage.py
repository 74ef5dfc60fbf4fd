"""The last stage: choose a deployment for the alias, call it, fall over to the next on retryable errors."""

import random
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from backends.base import Backend, UpstreamError
from gateway.context import Handler, Reply, RequestContext, Usage
from gateway.errors import OpenAIError, model_not_found
from gateway.sse import track_usage


class RouteStage:
    def __init__(self, pools: dict[str, list[Backend]], rng: random.Random | None = None) -> None:
        self._pools = pools
        self._rng = rng or random.Random()

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        last_error: UpstreamError | None = None
        for backend in self._order(self._candidates(ctx)):
            try:
                return await call_backend(backend, ctx)
            except UpstreamError as error:
                if not error.retryable:
                    raise
                last_error = error
        raise last_error or OpenAIError(503, "No deployment is available for this model.")

    def _candidates(self, ctx: RequestContext) -> list[Backend]:
        pool = self._pools.get(ctx.model)
        if pool is None:
            raise model_not_found(ctx.model)
        serving = [b for b in pool if ctx.endpoint in b.config.endpoints]
        if not serving:
            raise OpenAIError(400, f"The model `{ctx.model}` does not support {ctx.endpoint}.", param="model")
        return serving

    def _order(self, pool: list[Backend]) -> list[Backend]:
        """Weighted random order without replacement (Efraimidis–Spirakis keys)."""
        return sorted(
            pool, key=lambda b: self._rng.random() ** (1.0 / max(b.config.weight, 1e-9)), reverse=True
        )


async def call_backend(backend: Backend, ctx: RequestContext) -> Reply:
    """One call; for streams the first chunk is awaited here, so failures before it stay retryable."""
    ctx.deployment = backend.name
    if not ctx.stream:
        body = await backend.complete(ctx.endpoint, ctx.body, ctx.request_id)
        ctx.usage = Usage.from_openai(body.get("usage"))
        return Reply(body=body)
    chunks = backend.stream(ctx.endpoint, ctx.body, ctx.request_id)
    first = await anext(chunks, None)
    return Reply(stream=track_usage(ctx, _prepend(first, chunks)))


async def _prepend(
    first: dict[str, Any] | None, rest: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[dict[str, Any]]:
    async with aclosing(rest):
        if first is None:
            return
        yield first
        async for chunk in rest:
            yield chunk
