"""Server-sent events framing of OpenAI chunk objects, and what a chunk carries."""

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


def event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def has_token(chunk: dict[str, Any]) -> bool:
    """The chunk carries generated output: content, a tool call, reasoning, or completion text."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if (
            delta.get("content")
            or delta.get("tool_calls")
            or delta.get("reasoning_content")
            or choice.get("text")
        ):
            return True
    return False
