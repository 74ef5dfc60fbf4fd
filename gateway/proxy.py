"""The hot path: POST /v1/{chat/completions,completions,embeddings} as a bare ASGI handler.

It skips the framework's routing and middleware stack (measured in studies/README.md), reads the body
with a size limit, runs the pipeline, and writes JSON or SSE. Everything else goes to FastAPI.
"""

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from starlette.responses import Response

from core import validation
from core.context import Handler, Principal, Reply, RequestContext
from core.errors import OpenAIError, error_response
from core.ids import next_request_id
from gateway.inbound import client_request_id, decode_body, read_body
from gateway.sse import SSEResponse, sse_body

log = logging.getLogger("llmgw.proxy")
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}
JSON = "application/json"


Authenticate = Callable[[dict[str, str]], Principal]
Reject = Callable[[RequestContext, OpenAIError], None]


class Proxy:
    """`authenticate` (the auth stage alone) runs before the body is read, so a caller without a valid key
    gets a 401 whatever it sent; `reject` counts and logs what is refused before the pipeline."""

    def __init__(
        self, handler: Handler, max_body_bytes: int, authenticate: Authenticate, reject: Reject
    ) -> None:
        self._handler = handler
        self._limit = self.max_body_bytes = max_body_bytes
        self._authenticate = authenticate
        self._reject = reject

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any, endpoint: str) -> None:
        started = time.perf_counter()
        request_id = client_request_id(scope["headers"]) or next_request_id()
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        ctx = RequestContext(request_id, endpoint, {}, headers, "", started_at=started)
        try:
            try:
                await self._admit(ctx, receive)
            except OpenAIError as error:
                self._reject(ctx, error)
                raise
            response = render(ctx, await self._handler(ctx))
        except OpenAIError as error:
            response = error_response(error)
        except Exception:
            log.exception("request %s failed", request_id)
            response = error_response(
                OpenAIError(500, "The gateway hit an internal error. It has been logged.")
            )
        response.headers["x-request-id"] = request_id
        await response(scope, receive, send)

    async def _admit(self, ctx: RequestContext, receive: Any) -> None:
        """Who calls, then the body: read within the size limit, parsed, checked, and put on `ctx`."""
        ctx.principal = self._authenticate(ctx.headers)
        raw = await read_body(receive, ctx.headers, self._limit)
        body = validation.parse_json(decode_body(raw, ctx.headers.get("content-encoding", ""), self._limit))
        put_body(ctx, body)
        ctx.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        ctx.options = {k: body[k] for k in validation.GATEWAY_EXTENSIONS if k in body}


def put_body(ctx: RequestContext, body: dict[str, Any]) -> None:
    """Validate `body` for ctx.endpoint and put it on `ctx` as the pipeline reads it (the translated APIs too)."""
    validation.validate(ctx.endpoint, body)
    ctx.stream = bool(body.get("stream"))
    ctx.body = validation.upstream_body(body, ctx.stream)
    ctx.model = body["model"]
    ctx.extra_params = validation.extra_fields(ctx.endpoint, body)


def render(ctx: RequestContext, reply: Reply) -> Response | SSEResponse:
    if ctx.deployment:
        reply.headers.setdefault("x-served-by", ctx.deployment)
    if reply.stream is None:
        return Response(
            orjson.dumps(reply.body), status_code=reply.status, headers=reply.headers, media_type=JSON
        )
    return SSEResponse(sse_body(ctx, reply.stream), reply.headers)
