"""Turning a buffered completion into stream chunks, and hiding logprobs the client did not ask for."""

from collections.abc import AsyncIterator
from typing import Any


def strip_logprobs(payload: dict[str, Any], keep: bool) -> dict[str, Any]:
    """The cascade asks the small model for logprobs; they go out only when the client asked too."""
    if not keep:
        for choice in payload.get("choices") or []:
            if "logprobs" in choice:
                choice["logprobs"] = None
    return payload


async def as_chunks(endpoint: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """A whole chat/text completion as the chunks a streamed answer would have had, usage chunk last."""
    chat = endpoint == "chat"
    base = {"id": body.get("id", ""), "created": body.get("created", 0), "model": body.get("model", ""),
            "object": "chat.completion.chunk" if chat else "text_completion"}  # fmt: skip
    for choice in body.get("choices") or []:
        index, logprobs = choice.get("index", 0), choice.get("logprobs")
        if chat:
            message = choice.get("message") or {}
            delta = {"role": message.get("role", "assistant"), "content": message.get("content") or ""}
            yield {
                **base,
                "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}],
            }
            yield {
                **base,
                "choices": [{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}],
            }
        else:
            yield {**base, "choices": [{"index": index, "text": choice.get("text", ""), "logprobs": logprobs,
                                        "finish_reason": choice.get("finish_reason")}]}  # fmt: skip
    if body.get("usage"):
        yield {**base, "choices": [], "usage": body["usage"]}
