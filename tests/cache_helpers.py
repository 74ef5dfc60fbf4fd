"""Shared helpers for the cache tests: a counting upstream and request contexts."""

from collections.abc import AsyncIterator
from typing import Any

from cache.config import CachePolicy, CacheSettings
from cache.service import CacheService
from cache.stages import ExactCacheStage, SemanticCacheStage
from core.context import Handler, Principal, Reply, RequestContext
from gateway.pipeline import chain


class Upstream:
    """Answers every request with a fixed text, as JSON or as a stream; counts calls."""

    def __init__(self, text: str = "Paris is the capital of France.", finish: str = "stop") -> None:
        self.text, self.finish, self.calls = text, finish, 0
        self.fail_mid_stream = False

    async def __call__(self, ctx: RequestContext) -> Reply:
        self.calls += 1
        ctx.cost_usd = 0.002
        if ctx.stream:
            return Reply(stream=self._chunks())
        message = {"role": "assistant", "content": f"{self.text} #{self.calls}"}
        return Reply(
            body={**_head("chat.completion"), "choices": [_choice(message, self.finish)], "usage": USAGE}
        )

    async def _chunks(self) -> AsyncIterator[dict[str, Any]]:
        head = _head("chat.completion.chunk")
        yield {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        for word in f"{self.text} #{self.calls}".split(" "):
            yield {**head, "choices": [{"index": 0, "delta": {"content": word + " "}, "finish_reason": None}]}
            if self.fail_mid_stream:
                raise ConnectionError("upstream went away")
        yield {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": self.finish}]}
        yield {**head, "choices": [], "usage": USAGE}


USAGE = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}


def _head(kind: str) -> dict[str, Any]:
    return {"id": "up-1", "object": kind, "created": 1, "model": "small-1"}


def _choice(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}


class Policy:
    """Stands in for policies.Policy: only the cache section matters here."""

    def __init__(self, **cache: Any) -> None:
        self.cache = CachePolicy(**cache)


def ctx_for(
    question: str = "What is the capital of France?",
    tenant: str = "acme",
    system: str | None = None,
    stream: bool = False,
    headers: dict[str, str] | None = None,
    options: dict[str, Any] | None = None,
    policy: Any = None,
    **params: Any,
) -> RequestContext:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}
    ]
    body = {"model": "small", "messages": messages, "temperature": 0, **params}
    return RequestContext(
        request_id="r1",
        endpoint="chat",
        body=body,
        headers=headers or {},
        model="small",
        stream=stream,
        include_usage=stream,
        principal=Principal(tenant, f"key-{tenant}", "sk-x"),
        policy=policy,
        options=options or {},
    )


def pipeline(service: CacheService, upstream: Upstream) -> Handler:
    stages = [ExactCacheStage(service)]
    if service.semantic:
        stages.append(SemanticCacheStage(service))
    return chain([*stages, _Terminal(upstream)])


class _Terminal:
    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        return await self._upstream(ctx)


async def drain(reply: Reply) -> list[dict[str, Any]]:
    assert reply.stream is not None
    return [chunk async for chunk in reply.stream]


def settings(**overrides: Any) -> CacheSettings:
    return CacheSettings(semantic_enabled=False, **overrides)
