"""A chat completion → a Response object (and the pieces the stream renderer shares)."""

import time
from typing import Any

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def skeleton(
    response_id: str, model: str, echo: dict[str, Any], status: str = "in_progress"
) -> dict[str, Any]:
    """A Response object with no output yet: what `response.created` carries."""
    text = echo.get("text") or {"format": {"type": "text"}}
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "status": status,
        "error": None, "incomplete_details": None, "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"), "model": model, "output": [],
        "parallel_tool_calls": True, "previous_response_id": echo.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None}, "store": True,
        "temperature": echo.get("temperature") if echo.get("temperature") is not None else 1.0,
        "text": text, "tool_choice": echo.get("tool_choice") or "auto", "tools": echo.get("tools") or [],
        "top_p": echo.get("top_p") if echo.get("top_p") is not None else 1.0, "truncation": "disabled",
        "usage": None, "user": echo.get("user"), "metadata": echo.get("metadata") or {}, "completed_at": None,
    }  # fmt: skip


def finish(response: dict[str, Any], output: list[dict[str, Any]], finish_reason: str | None,
           usage: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """Fill in the output, the status and the usage. An item cut short is itself `incomplete`."""
    reason = _INCOMPLETE.get(finish_reason or "")
    for item in output:  # a message or call cut short is itself incomplete
        item["status"] = item_status(finish_reason)
    response.update(output=output, status="incomplete" if reason else "completed", usage=usage_of(usage))
    response["incomplete_details"] = {"reason": reason} if reason else None
    response["completed_at"] = None if reason else int(time.time())
    return response


def item_status(finish_reason: str | None) -> str:
    """An output message's status once the answer has ended."""
    return "incomplete" if finish_reason in _INCOMPLETE else "completed"


def from_completion(skeleton_: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    prefix = skeleton_["id"].removeprefix("resp_")
    if message.get("content") or not message.get("tool_calls"):  # item ids by output position, as streamed
        output.append(message_item(f"msg_{prefix}_0", message.get("content") or ""))
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        output.append(function_call_item(f"fc_{prefix}_{len(output)}", call.get("id") or f"call_{prefix}_{i}",
                                         function.get("name", ""), function.get("arguments") or ""))  # fmt: skip
    return finish(skeleton_, output, choice.get("finish_reason"), completion.get("usage"))


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [text_part(text)] if status == "completed" else []
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}  # fmt: skip


def usage_of(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    reasoning = int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": prompt + completion}  # fmt: skip


def output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as chat messages, for the next turn's history (previous_response_id)."""
    text = "".join(p.get("text", "") for item in output if item["type"] == "message" for p in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]
