"""The fake upstream's own POST /v1/responses (as vLLM serves it): echoes the last input text, calls the
first tool on "use-tool", and streams the documented events (no [DONE], as OpenAI's stream ends)."""

from typing import Any


def last_text(body: dict[str, Any]) -> str:
    given = body["input"]
    if isinstance(given, str):
        return given
    item = given[-1]
    if item.get("type") == "function_call_output":
        return str(item["output"])
    content = item.get("content")
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)


def response(body: dict[str, Any]) -> dict[str, Any]:
    text = last_text(body)
    if body.get("tools") and text.startswith("use-tool"):
        output = [{"type": "function_call", "id": "fc_up", "call_id": "call_up_1", "name": body["tools"][0]["name"],
                   "arguments": '{"city": "Oslo"}', "status": "completed"}]  # fmt: skip
    else:
        output = [{"type": "message", "id": "msg_up", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": f"native: {text}", "annotations": []}]}]  # fmt: skip
    usage = {
        "input_tokens": 11,
        "output_tokens": 2,
        "total_tokens": 13,
        "input_tokens_details": {"cached_tokens": 0},
    }
    return {"id": "resp_upstream", "object": "response", "created_at": 1, "model": body["model"], "status": "completed",
            "output": output, "usage": usage, "incomplete_details": None}  # fmt: skip


def events(body: dict[str, Any]) -> list[dict[str, Any]]:
    final = response(body)
    item = final["output"][0]
    started = {**final, "status": "in_progress", "output": [], "usage": None}
    out: list[dict[str, Any]] = [{"type": "response.created", "response": started}]
    if item["type"] == "function_call":
        out.append(
            {"type": "response.output_item.added", "output_index": 0, "item": {**item, "arguments": ""}}
        )
        out += [{"type": "response.function_call_arguments.delta", "output_index": 0, "delta": d}
                for d in ('{"city": ', '"Oslo"}')]  # fmt: skip
    else:
        words = item["content"][0]["text"].split(" ")
        out += [{"type": "response.output_text.delta", "output_index": 0, "delta": w if i == 0 else " " + w}
                for i, w in enumerate(words)]  # fmt: skip
    out.append({"type": "response.completed", "response": final})
    return out
