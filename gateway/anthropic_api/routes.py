"""POST /v1/messages: Anthropic's Messages API, with x-api-key or a bearer key."""

import logging

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from core.errors import OpenAIError
from gateway.anthropic_api import reply, stream
from gateway.anthropic_api.errors import anthropic_error_response
from gateway.anthropic_api.request import to_chat
from gateway.chat_bridge import Admission, StreamResponse, admit_chat, read_json, render_events, served_by

log = logging.getLogger("llmgw.messages")
router = APIRouter(tags=["Anthropic Messages"])
_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["model", "messages", "max_tokens"],
                    "properties": {
                        "model": {"type": "string"},
                        "messages": {"type": "array"},
                        "max_tokens": {"type": "integer"},
                        "system": {},
                        "tools": {"type": "array"},
                        "tool_choice": {"type": "object"},
                        "stream": {"type": "boolean"},
                        "stop_sequences": {"type": "array"},
                        "temperature": {"type": "number"},
                    },
                }
            }
        },  # fmt: skip
    },
    "parameters": [
        {"name": "x-api-key", "in": "header", "schema": {"type": "string"}},
        {"name": "anthropic-version", "in": "header", "schema": {"type": "string"}},
    ],  # fmt: skip
}


@router.post("/v1/messages", summary="Create a message (Anthropic Messages API)", openapi_extra=_DOC)
async def create_message(request: Request) -> Response:
    try:
        return await _create(request)
    except OpenAIError as error:
        return anthropic_error_response(error)
    except Exception:
        log.exception("POST /v1/messages failed")
        return anthropic_error_response(
            OpenAIError(500, "The gateway hit an internal error. It has been logged.")
        )


async def _create(request: Request) -> Response:
    headers = dict(request.headers)
    if "x-api-key" in headers and "authorization" not in headers:
        headers["authorization"] = f"Bearer {headers['x-api-key']}"
    admission = Admission(request, "messages", headers)
    async with admission as ctx:
        body = await read_json(request)
        admit_chat(ctx, to_chat(body), {"cache": body["cache"]} if "cache" in body else {})
    answer = await admission.run()
    message_id = f"msg_{ctx.request_id}"
    out_headers = {**answer.headers, **served_by(ctx), "request-id": ctx.request_id}
    if answer.stream is not None:
        return StreamResponse(
            render_events(stream.BlockWriter(message_id, ctx.model), answer.stream), out_headers
        )
    message = reply.message(message_id, ctx.model, answer.body or {})
    return Response(orjson.dumps(message), headers=out_headers, media_type="application/json")
