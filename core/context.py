"""What travels through the request pipeline: the request context, and the stage protocol.

Every piece of per-request state is a typed field here. What one package's stages pass among themselves
alone (the cache's plan for the request, say) goes in `ctx.notes`, keyed by its own type: `ctx.put(plan)`,
then `ctx.get(CacheRequest)` in the next stage, so core/ need not know the package's types.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from opentelemetry.trace import Tracer

from core.reply import Reply
from core.usage import Usage

T = TypeVar("T")


@dataclass
class Principal:
    """Who is calling: resolved from the bearer key by the auth stage."""

    tenant_id: str
    key_id: str
    key_prefix: str


class Policy(Protocol):
    """A tenant's policy, as the packages other than policies/ read it (policies.policy.Policy is the one).

    `cache`, `routing` and `cascade` are those packages' sections, as field dicts they validate themselves.
    """

    cache: dict[str, Any]
    routing: dict[str, Any]
    cascade: dict[str, Any]

    def allows(self, model: str) -> bool: ...


@dataclass
class UpstreamClock:
    """Time this request spent in the route stage (waiting on deployments), written by observe's timer."""

    waited_s: float = 0.0
    calls: int = 0

    def add(self, seconds: float) -> None:
        self.waited_s += seconds
        self.calls += 1


@dataclass
class CacheNote:
    """What a cache hit saved: written by cache/ when it serves an answer (or looked semantically and found
    nothing), read by the metrics."""

    status: str  # hit | semantic-hit | miss (a semantic lookup that found nothing)
    saved_prompt_tokens: int = 0
    saved_completion_tokens: int = 0
    saved_cost_usd: float = 0.0
    similarity: float | None = None  # semantic hits: the stored question's cosine similarity


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
    api: str | None = None  # "responses" | "messages" when a translated API sent the request
    principal: Principal | None = None
    policy: Policy | None = None  # the tenant's policy once resolved (policies/)
    deployment: str | None = None  # the deployment that served the answer
    cache_status: str = "bypass"  # hit | semantic-hit | miss | bypass
    cache: CacheNote | None = None  # set on cache hits
    cascade: str | None = None  # small | escalated
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    upstream: UpstreamClock = field(default_factory=UpstreamClock)
    in_flight_model: str | None = None  # the model label the in-flight gauge was raised under (metrics)
    tracer: Tracer | None = None  # set when the request is traced (gateway/tracing.py)
    options: dict[str, Any] = field(default_factory=dict)  # gateway extensions from the body, e.g. "cache"
    extra_params: tuple[str, ...] = ()  # body fields beyond OpenAI's, for deployments that accept extras
    notes: dict[type, Any] = field(default_factory=dict)  # one package's own notes between its stages

    def put(self, note: object) -> None:
        """Keep `note` for this package's later stages, under its type."""
        self.notes[type(note)] = note

    def get(self, kind: type[T]) -> T | None:
        return self.notes.get(kind)


Handler = Callable[[RequestContext], Awaitable[Reply]]


class Stage(Protocol):
    """A pipeline stage: may answer by itself, or call the next handler and look at its reply.

    Work to do when the reply has ended (usage, cost, limits, metrics) goes in one place:
    `await reply.on_end(hook)` (see core/reply.py); stages never wrap the stream for that.
    """

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply: ...
