"""What the translated APIs (/v1/responses, /v1/messages) share: they read a body, turn it into a chat
request, and run it through the very same stage list as /v1/chat/completions."""

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, Protocol

import orjson
from fastapi import Request
from starlette.responses import Response

from core import validation
from core.context import Principal, Reply, RequestContext
from core.errors import OpenAIError
from gateway.inbound import read_body
from gateway.proxy import put_body
from gateway.services import Services
from gateway.sse import SSEResponse

log = logging.getLogger("llmgw.bridge")
Event = dict[str, Any]


def services_of(request: Request) -> Services:
    return request.app.state.services


def request_id_of(request: Request) -> str:
    return request.state.request_id  # set by the app's RequestIdMiddleware


async def read_json(request: Request) -> dict[str, Any]:
    limit = services_of(request).settings.max_body_bytes
    return validation.parse_json(await read_body(request.receive, dict(request.headers), limit))


class Admission:
    """A translated API's request until the pipeline takes it: `async with Admission(...) as ctx` reads the
    key, the body and the translation onto `ctx`; an error inside is counted and access-logged as the
    OpenAI endpoints' refusals are (Services.reject), then raised. `run` hands `ctx` to the pipeline."""

    def __init__(self, request: Request, api: str, headers: dict[str, str] | None = None) -> None:
        self._services = services_of(request)
        headers = headers if headers is not None else dict(request.headers)
        self.ctx = RequestContext(request_id_of(request), "chat", {}, headers, "", started_at=time.perf_counter(),
                                  include_usage=True, api=api)  # fmt: skip

    async def __aenter__(self) -> RequestContext:
        try:  # a 401 before the body is read (no __aexit__ runs for an error here)
            self.ctx.principal = self._services.authenticate(self.ctx.headers)
        except OpenAIError as error:
            self._services.reject(self.ctx, error)
            raise
        return self.ctx

    async def __aexit__(self, kind: type | None, error: BaseException | None, trace: object) -> None:
        if isinstance(error, OpenAIError):
            self._services.reject(self.ctx, error)

    @property
    def principal(self) -> Principal:
        """The caller, once the `async with` has begun."""
        assert self.ctx.principal is not None
        return self.ctx.principal

    async def run(self) -> Reply:
        return await self._services.handler(self.ctx)


def admit_chat(ctx: RequestContext, chat: dict[str, Any], options: dict[str, Any] | None = None) -> None:
    """Validate `chat` as a chat-completions body and put it on `ctx` for the pipeline."""
    put_body(ctx, chat)
    ctx.options = options or {}


def principal_of(request: Request) -> Principal:
    """Who calls, for routes outside the pipeline (GET /v1/responses/{id}): a 401 for a missing or bad key."""
    return services_of(request).authenticate(request.headers)


def served_by(ctx: RequestContext) -> dict[str, str]:
    return {"x-served-by": ctx.deployment} if ctx.deployment else {}


class StreamResponse(Response):
    """An SSE stream as a framework response: disconnects cancel the pipeline (see gateway/sse.py)."""

    def __init__(self, frames: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        self._sse = SSEResponse(frames, headers)
        self.background = None
        self.status_code = 200

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self._sse(scope, receive, send)


class EventRenderer(Protocol):
    """Turns chat chunks into another API's events (each a dict with a "type")."""

    def start(self) -> list[Event]: ...

    def on_chunk(self, chunk: dict[str, Any]) -> list[Event]: ...

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[Event]: ...

    def failure(self, error: OpenAIError) -> Event: ...


def named_event(event: Event) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


async def render_events(
    renderer: EventRenderer,
    chunks: AsyncIterator[dict[str, Any]],
    after: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[bytes]:
    """SSE frames for a chat chunk stream; an error after the first byte ends it with the API's error event."""
    for event in renderer.start():
        yield named_event(event)
    finish_reason, usage = None, None
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                for event in renderer.on_chunk(chunk):
                    yield named_event(event)
                for choice in chunk.get("choices") or []:
                    finish_reason = choice.get("finish_reason") or finish_reason
                usage = chunk.get("usage") or usage
    except Exception as exc:
        if not isinstance(exc, OpenAIError):
            log.exception("translated stream failed")
            exc = OpenAIError(500, "The gateway failed while streaming.")
        yield named_event(renderer.failure(exc))
        return
    for event in renderer.finish(finish_reason, usage):
        yield named_event(event)
    if after is not None:
        await after()
