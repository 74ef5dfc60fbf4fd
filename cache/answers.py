"""Answers as stored: streamed chunks assembled into the non-streaming body, and what may be stored."""

from typing import Any

STORABLE_FINISH = frozenset({"stop", "tool_calls", "function_call"})


class StreamCollector:
    """Feeds on OpenAI chunk dicts (chat or completions) and builds the equivalent response body."""

    def __init__(self, endpoint: str) -> None:
        self._chat = endpoint == "chat"
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        if not self._head:
            self._head = {k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk}
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            self._add_choice(choice)

    def answer(self) -> dict[str, Any]:
        kind = "chat.completion" if self._chat else "text_completion"
        choices = [self._choices[i] for i in sorted(self._choices)]
        return {**self._head, "object": kind, "choices": choices, "usage": self._usage}

    def _add_choice(self, delta_choice: dict[str, Any]) -> None:
        index = int(delta_choice.get("index") or 0)
        choice = self._choices.setdefault(index, self._empty_choice(index))
        if delta_choice.get("finish_reason"):
            choice["finish_reason"] = delta_choice["finish_reason"]
        if delta_choice.get("stop_reason") is not None:  # vLLM's: the stop string or token that ended it
            choice["stop_reason"] = delta_choice["stop_reason"]
        _merge_logprobs(choice, delta_choice.get("logprobs"))
        if self._chat:
            _merge_delta(choice["message"], delta_choice.get("delta") or {})
        else:
            choice["text"] += delta_choice.get("text") or ""

    def _empty_choice(self, index: int) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "finish_reason": None, "logprobs": None}
        if self._chat:
            choice["message"] = {"role": "assistant", "content": None}
        else:
            choice["text"] = ""
        return choice


def _merge_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
    for name in ("content", "refusal"):
        if delta.get(name) is not None:
            message[name] = (message.get(name) or "") + delta[name]
    for call in delta.get("tool_calls") or ():
        _merge_tool_call(message.setdefault("tool_calls", []), call)


def _merge_tool_call(calls: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    index = int(delta.get("index") or 0)
    while len(calls) <= index:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    call["id"] = delta.get("id") or call["id"]
    call["type"] = delta.get("type") or call["type"]
    function = delta.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def _merge_logprobs(choice: dict[str, Any], logprobs: Any) -> None:
    if not isinstance(logprobs, dict):
        return
    merged = choice["logprobs"] = choice["logprobs"] or {}
    for name, value in logprobs.items():
        if isinstance(value, list):
            merged[name] = (merged.get(name) or []) + value
        else:
            merged[name] = value


def is_storable(answer: dict[str, Any] | None, store_truncated: bool) -> bool:
    """Only complete answers: every choice finished normally (or by length when the policy allows)."""
    if not isinstance(answer, dict) or "error" in answer or not answer.get("choices"):
        return False
    allowed = STORABLE_FINISH | {"length"} if store_truncated else STORABLE_FINISH
    return all(c.get("finish_reason") in allowed for c in answer["choices"])
