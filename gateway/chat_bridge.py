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
from gateway.proxy import read_body
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


async def run_chat(
    request: Request,
    chat: dict[str, Any],
    *,
    api: str,
    principal: Principal,
    options: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[RequestContext, Reply]:
    """Validate `chat` as a chat-completions body and run the pipeline on it for `principal` (principal_of,
    asked before the body was read)."""
    started = time.perf_counter()
    validation.validate("chat", chat)
    stream = bool(chat.get("stream"))
    ctx = RequestContext(
        request_id=request_id_of(request),
        endpoint="chat",
        body=validation.upstream_body(chat, stream),
        headers=headers if headers is not None else dict(request.headers),
        model=chat["model"],
        stream=stream,
        include_usage=True,
        started_at=started,
        options=options or {},
        extra_params=validation.extra_fields("chat", chat),
        api=api,
        principal=principal,
    )
    return ctx, await services_of(request).handler(ctx)


def principal_of(request: Request, headers: dict[str, str] | None = None) -> Principal:
    """Who calls, by the auth stage alone: asked before a body is read, and by routes outside the pipeline
    (GET /v1/responses/{id}). A 401 for a missing or bad key."""
    return services_of(request).authenticate(headers if headers is not None else dict(request.headers))


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
