"""What travels through the request pipeline: the request context and the reply."""

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_openai(cls, usage: dict[str, Any] | None) -> "Usage":
        if not usage:
            return cls()
        details = usage.get("prompt_tokens_details") or {}
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
        )


@dataclass
class Principal:
    """Who is calling: resolved from the bearer key by the auth stage."""

    tenant_id: str
    key_id: str
    key_prefix: str


@dataclass
class RequestContext:
    """One request's state. Stages read and write it; nothing here is global."""

    request_id: str
    endpoint: str  # "chat" | "completions" | "embeddings"
    body: dict[str, Any]  # the validated body as sent upstream (extensions removed, usage requested)
    headers: dict[str, str]  # incoming headers, lower-case names
    model: str  # the public model alias asked for
    stream: bool = False
    include_usage: bool = False  # the client asked for a usage chunk
    started_at: float = 0.0  # time.perf_counter() at arrival
    principal: Principal | None = None
    policy: Any = None  # policies.Policy once resolved
    deployment: str | None = None  # the deployment that served the answer
    cache_status: str = "bypass"  # hit | semantic-hit | miss | bypass
    cascade: str | None = None  # small | escalated
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)  # gateway extensions from the body, e.g. "cache"
    extra_params: tuple[str, ...] = ()  # body fields beyond OpenAI's, for deployments that accept extras
    extra: dict[str, Any] = field(default_factory=dict)  # stage-private notes, keyed by stage name


@dataclass
class Reply:
    """A backend's answer: a JSON body, or a stream of OpenAI chunk objects."""

    body: dict[str, Any] | None = None
    stream: AsyncIterator[dict[str, Any]] | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[RequestContext], Awaitable[Reply]]


async def after_stream(
    chunks: AsyncIterator[dict[str, Any]], on_end: Callable[[], None]
) -> AsyncIterator[dict[str, Any]]:
    """Pass the chunks through; call `on_end` however the stream ends (done, failed, cancelled, closed)."""
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk
    finally:
        on_end()


class Stage(Protocol):
    """A pipeline stage: may answer by itself, or call the next handler and wrap its reply.

    Stages that must act when a stream ends wrap `reply.stream` in an async generator; the
    code after its `async for` runs only when the stream completed normally, and a `finally`
    block runs on cancellation and errors too.
    """

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply: ...
