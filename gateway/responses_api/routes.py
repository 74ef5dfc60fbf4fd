"""POST /v1/responses, GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items."""

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from core.context import Principal
from core.errors import OpenAIError, bad_request
from core.ids import next_request_id
from gateway.chat_bridge import (
    Admission,
    StreamResponse,
    admit_chat,
    principal_of,
    read_json,
    render_events,
    served_by,
)
from gateway.responses_api import reply, stream
from gateway.responses_api.request import to_chat
from gateway.responses_api.store import ResponseStore, StoredResponse

JSON = "application/json"
router = APIRouter(tags=["Responses"])
_CREATE_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "required": ["model", "input"],
                    "properties": {
                        "model": {"type": "string"},
                        "input": {"oneOf": [{"type": "string"}, {"type": "array"}]},
                        "instructions": {"type": "string"},
                        "stream": {"type": "boolean"},
                        "store": {"type": "boolean"},
                        "previous_response_id": {"type": "string"},
                        "tools": {"type": "array"},
                        "tool_choice": {},
                        "text": {"type": "object"},
                        "max_output_tokens": {"type": "integer"},
                        "temperature": {"type": "number"},
                        "top_p": {"type": "number"},
                    },
                }
            }
        },  # fmt: skip
    }
}


def _store(request: Request) -> ResponseStore:
    return request.app.state.response_store


@router.post(
    "/v1/responses", summary="Create a model response (OpenAI Responses API)", openapi_extra=_CREATE_DOC
)
async def create_response(request: Request) -> Response:
    admission = Admission(request, "responses")
    async with admission as ctx:
        body = await read_json(request)
        previous = await _previous(request, body.get("previous_response_id"), admission.principal)
        translated = to_chat(body, previous.history if previous else None)
        admit_chat(ctx, translated.chat, {"cache": body["cache"]} if "cache" in body else {})
    answer = await admission.run()
    store = _store(request)
    response_id = f"resp_{next_request_id()}"  # never the client's x-request-id: stored ids must be ours
    skeleton = reply.skeleton(response_id, ctx.model, translated.echo)
    skeleton["store"] = body.get("store", True) is not False
    tenant = ctx.principal.tenant_id if ctx.principal else ""

    async def keep(response: dict[str, Any]) -> None:
        if response["store"]:
            history = translated.history + reply.output_messages(response["output"])
            items = body["input"] if isinstance(body["input"], list) else [_text_item(body["input"])]
            await store.put(StoredResponse(tenant, response, history, items))

    if answer.stream is not None:
        writer = stream.EventWriter(skeleton)
        frames = render_events(writer, answer.stream, lambda: keep(writer.response))
        return StreamResponse(frames, {**answer.headers, **served_by(ctx)})
    response = reply.from_completion(skeleton, answer.body or {})
    await keep(response)
    return Response(orjson.dumps(response), status_code=200, headers={**answer.headers, **served_by(ctx)},
                    media_type=JSON)  # fmt: skip


@router.get("/v1/responses/{response_id}", summary="Retrieve a stored response")
async def get_response(request: Request, response_id: str) -> Response:
    record = await _owned(request, response_id, principal_of(request))
    return Response(orjson.dumps(record.response), media_type=JSON)


@router.delete("/v1/responses/{response_id}", summary="Delete a stored response")
async def delete_response(request: Request, response_id: str) -> Response:
    await _owned(request, response_id, principal_of(request))
    await _store(request).delete(response_id)
    return Response(orjson.dumps({"id": response_id, "object": "response", "deleted": True}), media_type=JSON)


@router.get("/v1/responses/{response_id}/input_items", summary="List a stored response's input items")
async def input_items(request: Request, response_id: str) -> Response:
    record = await _owned(request, response_id, principal_of(request))
    data = [{"id": f"in_{response_id}_{i}", **item} for i, item in enumerate(record.input_items)]
    page = {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": False}  # fmt: skip
    return Response(orjson.dumps(page), media_type=JSON)


async def _previous(request: Request, response_id: Any, principal: Principal) -> StoredResponse | None:
    if response_id is None:
        return None
    if not isinstance(response_id, str):
        raise bad_request("'previous_response_id' must be a string.", param="previous_response_id")
    return await _owned(request, response_id, principal, param="previous_response_id")


async def _owned(
    request: Request, response_id: str, principal: Principal, param: str | None = None
) -> StoredResponse:
    """The stored response, if `principal`'s tenant created it; 404 otherwise (also when expired)."""
    record = await _store(request).get(response_id)
    if record is None or record.tenant != principal.tenant_id:
        raise OpenAIError(404, f"Response with id '{response_id}' not found.", param=param, code="not_found")
    return record


def _text_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
