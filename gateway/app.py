"""The HTTP application: OpenAI-compatible routes in front of the pipeline."""

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response, StreamingResponse

from gateway import validation
from gateway.context import Handler, Reply, RequestContext
from gateway.errors import OpenAIError
from gateway.services import Services, start_services
from gateway.settings import Settings
from gateway.sse import sse_body

JSON = "application/json"


def create_app(settings: Settings) -> FastAPI:
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = await start_services(settings)
        state["services"] = services
        state["handler"] = services.handler
        app.state.services = services
        try:
            yield
        finally:
            await services.aclose()

    app = FastAPI(title="llmgw", version="0.1.0", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    _add_error_handlers(app)
    _add_proxy_routes(app, settings, state)
    _add_info_routes(app, settings, state)
    app.add_middleware(RequestIdMiddleware)
    return app


def _add_proxy_routes(app: FastAPI, settings: Settings, state: dict[str, Any]) -> None:
    async def proxy(request: Request, endpoint: str) -> Response:
        ctx = await _context(request, endpoint, settings.max_body_bytes)
        handler: Handler = state["handler"]
        return _render(ctx, await handler(ctx))

    async def chat(request: Request) -> Response:
        return await proxy(request, "chat")

    async def completions(request: Request) -> Response:
        return await proxy(request, "completions")

    async def embeddings(request: Request) -> Response:
        return await proxy(request, "embeddings")

    app.add_api_route("/v1/chat/completions", chat, methods=["POST"], include_in_schema=False)
    app.add_api_route("/v1/completions", completions, methods=["POST"], include_in_schema=False)
    app.add_api_route("/v1/embeddings", embeddings, methods=["POST"], include_in_schema=False)


def _add_info_routes(app: FastAPI, settings: Settings, state: dict[str, Any]) -> None:
    async def models(request: Request) -> Response:
        services: Services = state["services"]
        await services.authenticate(request.headers)
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "llmgw"} for m in services.model_names()
        ]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type=JSON)

    async def live() -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def ready() -> Response:
        services: Services | None = state.get("services")
        report = await services.readiness() if services else {"ready": False}
        return Response(orjson.dumps(report), status_code=200 if report["ready"] else 503, media_type=JSON)

    app.add_api_route("/v1/models", models, methods=["GET"], include_in_schema=False)
    app.add_api_route("/health/live", live, methods=["GET"])
    app.add_api_route("/health/ready", ready, methods=["GET"])


async def _context(request: Request, endpoint: str, limit: int) -> RequestContext:
    body = validation.parse_json(await _read_body(request, limit))
    validation.validate(endpoint, body)
    stream = bool(body.get("stream"))
    return RequestContext(
        request_id=request.scope["request_id"],
        endpoint=endpoint,
        body=validation.upstream_body(body, stream),
        headers=dict(request.headers),
        model=body["model"],
        stream=stream,
        include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
        started_at=request.scope["started_at"],
        options={k: body[k] for k in validation.GATEWAY_EXTENSIONS if k in body},
    )


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise validation.too_large(limit)
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise validation.too_large(limit)
        parts.append(part)
    return b"".join(parts)


def _render(ctx: RequestContext, reply: Reply) -> Response:
    if reply.stream is None:
        return Response(
            orjson.dumps(reply.body), status_code=reply.status, headers=reply.headers, media_type=JSON
        )
    headers = {"cache-control": "no-cache", "x-accel-buffering": "no", **reply.headers}
    return StreamingResponse(sse_body(ctx, reply.stream), headers=headers, media_type="text/event-stream")


def error_response(error: OpenAIError) -> Response:
    return Response(error.to_json(), status_code=error.status, headers=error.headers, media_type=JSON)


def _add_error_handlers(app: FastAPI) -> None:
    async def on_openai_error(request: Request, exc: OpenAIError) -> Response:
        return error_response(exc)

    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        message = {404: "Unknown request URL.", 405: "Method not allowed."}.get(
            exc.status_code, str(exc.detail)
        )
        return error_response(
            OpenAIError(exc.status_code, f"{message} ({request.method} {request.url.path})")
        )

    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(
            OpenAIError(422, f"Invalid request: {first.get('msg', 'invalid input')}", param=param)
        )

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return error_response(OpenAIError(500, "The gateway hit an internal error. It has been logged."))

    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)


class RequestIdMiddleware:
    """Gives every request an id (scope["request_id"]) and every response the x-request-id header."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = scope["request_id"] = uuid.uuid4().hex
        scope["started_at"] = time.perf_counter()
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        await self.app(scope, receive, send_with_id)
