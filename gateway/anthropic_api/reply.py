"""A chat completion → an Anthropic Message."""

from typing import Any

import orjson

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}  # fmt: skip


def message(message_id: str, model: str, completion: dict[str, Any]) -> dict[str, Any]:
    choice = (completion.get("choices") or [{}])[0]
    answer = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if answer.get("content"):
        content.append({"type": "text", "text": answer["content"]})
    for call in answer.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": tool_use_id(call.get("id")), "name": function.get("name"),
                        "input": tool_input(function.get("arguments"))})  # fmt: skip
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            **stop_fields(choice.get("finish_reason"), choice.get("stop_reason")),
            "usage": usage_of(completion.get("usage"))}  # fmt: skip


def tool_use_id(call_id: str | None) -> str | None:
    """A chat tool-call id in Anthropic's form, `toolu_…`. The client sends it back in its tool_use and
    tool_result blocks alike, so the chat history sent upstream stays consistent as it is."""
    if not call_id or call_id.startswith("toolu_"):
        return call_id
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(finish_reason: str | None) -> str | None:
    return STOP_REASONS.get(finish_reason or "", "end_turn") if finish_reason else None


def stop_fields(finish_reason: str | None, matched: Any) -> dict[str, Any]:
    """stop_reason and stop_sequence. `matched` is the choice's `stop_reason` as vLLM (and our engine) send it:
    the stop string that ended the answer, a stop token id, or None for the end-of-sequence token."""
    if finish_reason == "stop" and isinstance(matched, str):
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    return {"stop_reason": stop_reason(finish_reason) or "end_turn", "stop_sequence": None}


def tool_input(arguments: str | None) -> Any:
    """Tool arguments as JSON; a model that wrote invalid JSON gets its text back under `raw`."""
    try:
        return orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"raw": arguments}


def usage_of(usage: dict[str, Any] | None) -> dict[str, int]:
    usage = usage or {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {"input_tokens": int(usage.get("prompt_tokens") or 0) - cached,
            "output_tokens": int(usage.get("completion_tokens") or 0),
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}  # fmt: skip
