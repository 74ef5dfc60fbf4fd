"""POST /v1/messages: Anthropic's Messages API, with x-api-key or a bearer key."""

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from core.errors import OpenAIError
from core.ids import next_request_id
from gateway.anthropic_api import reply, stream
from gateway.anthropic_api.errors import anthropic_error_response
from gateway.anthropic_api.request import to_chat, to_counted_chat
from gateway.chat_bridge import (
    Admission,
    StreamResponse,
    admit_chat,
    read_json,
    render_events,
    served_by,
    services_of,
)

log = logging.getLogger("llmgw.messages")
router = APIRouter(tags=["Anthropic Messages"])
_FIELDS = {"model": {"type": "string"}, "messages": {"type": "array"}, "max_tokens": {"type": "integer"}, "system": {},
           "tools": {"type": "array"}, "tool_choice": {"type": "object"}, "stream": {"type": "boolean"},
           "stop_sequences": {"type": "array"}, "temperature": {"type": "number"}}  # fmt: skip
_HEADERS = [
    {"name": name, "in": "header", "schema": {"type": "string"}}
    for name in ("x-api-key", "anthropic-version")
]


def _doc(required: list[str], fields: list[str]) -> dict[str, Any]:
    """The OpenAPI request body and headers of a Messages route (its JSON body is read by hand)."""
    schema = {"type": "object", "required": required, "properties": {name: _FIELDS[name] for name in fields}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "parameters": _HEADERS}  # fmt: skip


_DOC = _doc(["model", "messages", "max_tokens"], list(_FIELDS))
_COUNT_DOC = _doc(["model", "messages"], ["model", "messages", "system", "tools", "tool_choice"])


@router.post("/v1/messages", summary="Create a message (Anthropic Messages API)", openapi_extra=_DOC)
async def create_message(request: Request) -> Response:
    return await _answer(request, _create)


@router.post("/v1/messages/count_tokens", summary="Count a message's input tokens (Anthropic Messages API)",
             openapi_extra=_COUNT_DOC)  # fmt: skip
async def count_tokens(request: Request) -> Response:
    return await _answer(request, _count)


async def _answer(request: Request, handle: Callable[[Request], Awaitable[Response]]) -> Response:
    """The handler's answer; any error in Anthropic's shape (an unexpected one logged, its text withheld)."""
    try:
        return await handle(request)
    except OpenAIError as error:
        if error.code == "missing_api_key":  # Anthropic's clients send x-api-key
            error = OpenAIError(
                401, "x-api-key header is required (or Authorization: Bearer).", code=error.code
            )
        return anthropic_error_response(error)
    except Exception:
        log.exception("POST %s failed", request.url.path)
        return anthropic_error_response(
            OpenAIError(500, "The gateway hit an internal error. It has been logged.")
        )


def _with_bearer(request: Request) -> dict[str, str]:
    """The request's headers, Anthropic's x-api-key read as the bearer key it stands for."""
    headers = dict(request.headers)
    if "x-api-key" in headers and "authorization" not in headers:
        headers["authorization"] = f"Bearer {headers['x-api-key']}"
    return headers


async def _count(request: Request) -> Response:
    """{"input_tokens": N}: what a /v1/messages request with this body would report as its input tokens."""
    admission = Admission(request, "count_tokens", _with_bearer(request))
    async with admission as ctx:
        chat = to_counted_chat(await read_json(request))
        count = await services_of(request).count_tokens(admission.principal, chat, ctx.request_id)
    return Response(orjson.dumps({"input_tokens": count}), headers={"request-id": ctx.request_id},
                    media_type="application/json")  # fmt: skip


async def _create(request: Request) -> Response:
    admission = Admission(request, "messages", _with_bearer(request))
    async with admission as ctx:
        body = await read_json(request)
        chat = to_chat(body)
        if chat.get("stream"):  # usage on every chunk where the deployment can (vLLM, our engine): the
            chat["stream_options"] = {"continuous_usage_stats": True}  # input tokens go in message_start
        admit_chat(ctx, chat, {"cache": body["cache"]} if "cache" in body else {})
    answer = await admission.run()
    message_id = f"msg_{next_request_id()}"
    out_headers = {**answer.headers, **served_by(ctx), "request-id": ctx.request_id}
    if answer.stream is not None:
        return StreamResponse(
            render_events(stream.BlockWriter(message_id, ctx.model), answer.stream), out_headers
        )
    message = reply.message(message_id, ctx.model, answer.body or {})
    return Response(orjson.dumps(message), headers=out_headers, media_type="application/json")
