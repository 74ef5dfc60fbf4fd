"""A stored answer served again: as a response body, or as a well-formed chunk stream."""

import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

_PIECE = re.compile(r"\S*\s*")
_PIECE_CHARS = 48  # replayed content is cut at whitespace into pieces of about this size


def replay_body(answer: dict[str, Any], response_id: str) -> dict[str, Any]:
    return {**answer, "id": response_id, "created": int(time.time())}


async def replay_stream(
    answer: dict[str, Any], response_id: str, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    """Role chunk, content chunks, finish chunk per choice, then the usage chunk when asked for."""
    chat = answer.get("object") == "chat.completion"
    head = _chunk_head(answer, response_id, chat)
    for choice in answer.get("choices") or ():
        deltas = _chat_deltas(choice) if chat else _text_deltas(choice)
        for delta in deltas:
            yield {**head, "choices": [{"index": choice.get("index", 0), **delta}]}
    if include_usage:
        yield {**head, "choices": [], "usage": answer.get("usage")}


def _chunk_head(answer: dict[str, Any], response_id: str, chat: bool) -> dict[str, Any]:
    head = {
        "id": response_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": answer.get("model"),
    }
    if answer.get("system_fingerprint"):
        head["system_fingerprint"] = answer["system_fingerprint"]
    return head


def _chat_deltas(choice: dict[str, Any]) -> Iterator[dict[str, Any]]:
    message = choice.get("message") or {}
    yield {"delta": {"role": message.get("role", "assistant"), "content": ""}, "finish_reason": None}
    for piece in split_text(message.get("content") or ""):
        yield {"delta": {"content": piece}, "finish_reason": None}
    for index, call in enumerate(message.get("tool_calls") or ()):
        yield {"delta": {"tool_calls": [{"index": index, **call}]}, "finish_reason": None}
    if message.get("refusal"):
        yield {"delta": {"refusal": message["refusal"]}, "finish_reason": None}
    yield {"delta": {}, "logprobs": choice.get("logprobs"), **_ending(choice)}


def _text_deltas(choice: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for piece in split_text(choice.get("text") or ""):
        yield {"text": piece, "logprobs": None, "finish_reason": None}
    yield {"text": "", "logprobs": choice.get("logprobs"), **_ending(choice)}


def _ending(choice: dict[str, Any]) -> dict[str, Any]:
    """finish_reason, and vLLM's stop_reason where the stored answer has one."""
    ending = {"finish_reason": choice.get("finish_reason")}
    if choice.get("stop_reason") is not None:
        ending["stop_reason"] = choice["stop_reason"]
    return ending


def split_text(text: str) -> list[str]:
    """Whitespace-aligned pieces whose concatenation is exactly `text`."""
    pieces: list[str] = []
    for word in _PIECE.findall(text):
        if pieces and len(pieces[-1]) + len(word) <= _PIECE_CHARS:
            pieces[-1] += word
        elif word:
            pieces.append(word)
    if text and not pieces:
        pieces.append(text)
    return pieces
