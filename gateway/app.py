"""The HTTP application: the proxy hot path in front of a FastAPI app for everything else."""

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from core.errors import OpenAIError, error_response, model_not_found
from core.ids import next_request_id
from core.validation import too_large
from gateway.anthropic_api.errors import anthropic_error_response
from gateway.anthropic_api.routes import router as messages_router
from gateway.inbound import bounded_receive, client_request_id, declared_size, decoded
from gateway.lifecycle import close_within
from gateway.openapi import allowed_methods, install_openapi
from gateway.proxy import ENDPOINTS, JSON, Proxy
from gateway.responses_api.routes import router as responses_router
from gateway.responses_api.store import create_response_store
from gateway.services import DatabaseUnusable, Services, redis_connector, start_services
from gateway.settings import Settings, load_settings
from gateway.ui.routes import install_ui

log = logging.getLogger("llmgw.app")


class GatewayApp(FastAPI):
    """FastAPI, with the three proxy routes answered before the framework's stack."""

    proxy: Proxy | None = None
    startup_problem: str | None = None  # a database the gateway cannot start with, said in one line

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await super().__call__(scope, receive, self._short_startup_failure(send))
        endpoint = ENDPOINTS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint and self.proxy is not None:
            if scope["method"] != "POST":
                error = OpenAIError(405, f"Method not allowed: use POST for {scope['path']}.")
                error.headers["allow"] = "POST"
                error.headers["x-request-id"] = client_request_id(scope["headers"]) or next_request_id()
                return await error_response(error)(scope, receive, send)
            return await self.proxy(scope, receive, send, endpoint)
        if scope["type"] == "http" and self.proxy is not None:  # the admin API and the rest: same body limit
            limit = self.proxy.max_body_bytes
            try:
                if declared_size(scope["headers"]) > limit:
                    raise too_large(limit)
                receive = bounded_receive(receive, limit)
                scope, receive = await decoded(scope, receive, limit)  # gzip/deflate, as on the proxy
            except OpenAIError as error:
                return await _error_response_for(scope["path"])(error)(scope, receive, send)
        return await super().__call__(scope, receive, send)

    def _short_startup_failure(self, send: Any) -> Any:
        """uvicorn logs a failed start-up's message, which Starlette fills with the whole traceback (150 lines
        for an unreachable PostgreSQL); a known problem is sent as its one line instead."""

        async def send_short(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.startup.failed" and self.startup_problem is not None:
                message = {**message, "message": f"llmgw: {self.startup_problem}"}
            await send(message)

        return send_short


def _error_response_for(path: str) -> Callable[[OpenAIError], Response]:
    """Errors in the shape of the API the path belongs to: Anthropic's under /v1/messages, else OpenAI's."""
    return anthropic_error_response if path.startswith("/v1/messages") else error_response


def app_from_environment() -> GatewayApp:
    """For `uvicorn --factory` with several workers: each worker reads the settings itself."""
    return create_app(load_settings())


def create_app(settings: Settings) -> GatewayApp:
    @asynccontextmanager
    async def lifespan(app: GatewayApp) -> AsyncIterator[None]:
        try:
            services = await start_services(settings)
        except DatabaseUnusable as error:
            app.startup_problem = str(error)
            raise
        app.state.services = services
        if not any(getattr(r, "path", "").startswith("/admin/v1") for r in app.routes):
            app.include_router(services.admin_router)
        app.proxy = Proxy(services.handler, settings.max_body_bytes, services.authenticate, services.reject)
        restore_signals = (
            services.drain.hook_signals()
        )  # SIGTERM: readiness fails at once (gateway/lifecycle.py)
        app.state.response_store = create_response_store(
            settings.responses, settings.redis_url, redis_connector(settings, "responses")
        )
        try:
            yield
        finally:
            restore_signals()
            app.proxy = None
            await close_within([app.state.response_store.aclose], settings.shutdown_grace_s)
            await services.aclose()

    app = GatewayApp(title="llmgw", version="0.1.0", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    _add_error_handlers(app)
    _add_info_routes(app)
    app.include_router(responses_router)
    app.include_router(messages_router)
    install_ui(app, settings)  # the operator console at /ui (gateway/ui/), when an admin token is set
    install_openapi(app)
    app.add_middleware(RequestIdMiddleware)
    return app


def _services(request: Request) -> Services:
    return request.app.state.services


def _add_info_routes(app: FastAPI) -> None:
    async def models(request: Request) -> Response:
        names = await _services(request).visible_models(request.headers)
        data = [model_card(m, _services(request).owner_of(m)) for m in names]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type=JSON)

    async def model(request: Request, model_id: str) -> Response:
        if model_id not in await _services(request).visible_models(request.headers):
            raise model_not_found(model_id)
        card = model_card(model_id, _services(request).owner_of(model_id))
        return Response(orjson.dumps(card), media_type=JSON)

    async def metrics(request: Request) -> Response:
        body, content_type = _services(request).observability.render()
        return Response(body, headers={"content-type": content_type})

    async def live() -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def ready(request: Request) -> Response:
        report = await _services(request).readiness()
        return Response(orjson.dumps(report), status_code=200 if report["ready"] else 503, media_type=JSON)

    app.add_api_route("/v1/models", models, methods=["GET"], include_in_schema=False)
    app.add_api_route("/v1/models/{model_id:path}", model, methods=["GET"], summary="Retrieve a model")
    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
    app.add_api_route("/health/live", live, methods=["GET"])
    app.add_api_route("/health/ready", ready, methods=["GET"])


_STARTED = int(time.time())  # a model card's `created`: when this gateway started, as vLLM reports it


def model_card(name: str, owned_by: str = "llmgw") -> dict[str, Any]:
    return {"id": name, "object": "model", "created": _STARTED, "owned_by": owned_by}


def _add_error_handlers(app: FastAPI) -> None:
    async def on_openai_error(request: Request, exc: OpenAIError) -> Response:
        return error_response(exc)

    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        message = {404: "Unknown request URL.", 405: "Method not allowed."}.get(
            exc.status_code, str(exc.detail)
        )
        error = OpenAIError(exc.status_code, f"{message} ({request.method} {request.url.path})")
        error.headers.update({k: v for k, v in (exc.headers or {}).items() if k.lower() != "allow"})
        if exc.status_code == 405:  # Starlette's Allow names one route's methods; a path may have several
            error.headers["allow"] = allowed_methods(request.app, request.url.path)
        return _error_response_for(request.url.path)(error)

    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(
            OpenAIError(422, f"Invalid request: {first.get('msg', 'invalid input')}", param=param)
        )

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(OpenAIError(500, "The gateway hit an internal error. It has been logged."))

    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)


class RequestIdMiddleware:
    """Gives every framework-routed response an x-request-id header (the proxy path sets its own)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = client_request_id(scope["headers"]) or next_request_id()
        scope.setdefault("state", {})["request_id"] = request_id  # routes that run the pipeline use it
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        await self.app(scope, receive, send_with_id)
