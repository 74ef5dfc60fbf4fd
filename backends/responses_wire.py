"""For deployments with `responses_api: true` (vLLM): a request that came in on /v1/responses goes to the
upstream's own POST /responses. The pipeline works on chat bodies (so caches, cascades and accounting
apply unchanged); this module turns the chat body into a Responses request at the last moment and the
upstream's answer (object or event stream) back into a chat completion or chat chunks."""

from typing import Any

from backends.base import UpstreamError
from core.completion import requested_completion_tokens

_CARRIED = ("model", "temperature", "top_p", "parallel_tool_calls", "user", "seed", "stream",
            "prompt_cache_key", "safety_identifier", "service_tier", "top_logprobs")  # fmt: skip
_FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}
FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})


def to_responses(chat: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {k: chat[k] for k in _CARRIED if k in chat}
    body["store"] = False  # the gateway keeps the conversation; the upstream needs none
    system = [
        m["content"] for m in chat["messages"] if m["role"] == "system" and isinstance(m["content"], str)
    ]
    if system:
        body["instructions"] = "\n\n".join(system)
    body["input"] = [item for m in chat["messages"] if m["role"] != "system" for item in _items(m)]
    if asked := requested_completion_tokens(chat):
        body["max_output_tokens"] = asked
    if chat.get("tools"):
        body["tools"] = [{"type": "function", **t["function"]} for t in chat["tools"]]
    choice = chat.get("tool_choice")
    if choice is not None:
        body["tool_choice"] = (
            {"type": "function", "name": choice["function"]["name"]} if isinstance(choice, dict) else choice
        )
    fmt = chat.get("response_format")
    if fmt:
        body["text"] = {
            "format": {"type": "json_schema", **fmt["json_schema"]} if fmt["type"] == "json_schema" else fmt
        }
    if chat.get("reasoning_effort"):
        body["reasoning"] = {"effort": chat["reasoning_effort"]}
    return body


def _items(message: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = message["role"], message.get("content")
    if role == "tool":
        return [
            {"type": "function_call_output", "call_id": message.get("tool_call_id"), "output": content or ""}
        ]
    items: list[dict[str, Any]] = []
    if content:
        items.append({"type": "message", "role": role, "content": _parts(role, content)})
    for call in message.get("tool_calls") or []:
        items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                      "arguments": call["function"]["arguments"]})  # fmt: skip
    return items


def _parts(role: str, content: Any) -> Any:
    if isinstance(content, str):
        return content
    text_type = "output_text" if role == "assistant" else "input_text"
    parts = []
    for part in content:
        if part.get("type") == "image_url":
            image = part["image_url"]
            parts.append(
                {"type": "input_image", "image_url": image["url"], "detail": image.get("detail", "auto")}
            )
        else:
            parts.append({"type": text_type, "text": part.get("text", "")})
    return parts


def to_completion(response: dict[str, Any]) -> dict[str, Any]:
    """The upstream's Response object as a chat completion."""
    text, calls = "", []
    for item in response.get("output") or []:
        if item.get("type") == "message":
            text += "".join(
                p.get("text", "") for p in item.get("content") or [] if p.get("type") == "output_text"
            )
        elif item.get("type") == "function_call":
            calls.append({"id": item.get("call_id"), "type": "function",
                          "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}})  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": _finish_reason(response, bool(calls)),
        "logprobs": None,
    }
    return {"id": response.get("id"), "object": "chat.completion", "created": response.get("created_at", 0),
            "model": response.get("model"), "choices": [choice], "usage": _usage(response.get("usage"))}  # fmt: skip


class ChunkTranslator:
    """The upstream's Responses events → chat chunks (text deltas, tool-call deltas, finish, usage)."""

    def __init__(self) -> None:
        self._calls: dict[int, int] = {}  # output_index → chat tool-call index

    def on_event(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "response.output_text.delta":
            return [self._chunk({"content": event.get("delta", "")})]
        if kind == "response.output_item.added" and (event.get("item") or {}).get("type") == "function_call":
            item, index = event["item"], len(self._calls)
            self._calls[event.get("output_index", index)] = index
            call = {"index": index, "id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": ""}}  # fmt: skip
            return [self._chunk({"role": "assistant", "tool_calls": [call]})]
        if kind == "response.function_call_arguments.delta":
            index = self._calls.get(event.get("output_index", 0), 0)
            return [
                self._chunk(
                    {"tool_calls": [{"index": index, "function": {"arguments": event.get("delta", "")}}]}
                )
            ]
        if kind in ("response.completed", "response.incomplete"):
            response = event.get("response") or {}
            finish = self._chunk({}, _finish_reason(response, bool(self._calls)))
            return [finish, {**self._chunk({}), "choices": [], "usage": _usage(response.get("usage"))}]
        if kind in ("response.failed", "error"):
            error = (event.get("response") or {}).get("error") or event
            raise UpstreamError(
                502, f"the deployment's Responses stream failed: {error.get('message')}", retryable=False
            )
        return []

    @staticmethod
    def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }


def _finish_reason(response: dict[str, Any], called: bool) -> str:
    reason = (response.get("incomplete_details") or {}).get("reason")
    return _FINISH.get(reason or "", "length") if reason else ("tool_calls" if called else "stop")


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    prompt, completion = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
