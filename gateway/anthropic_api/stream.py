"""Chat chunks → Anthropic's event stream: message_start, then per content block content_block_start,
content_block_delta (text_delta or input_json_delta) and content_block_stop, then message_delta
(stop_reason, usage) and message_stop. One block is open at a time, as Anthropic streams them."""

from typing import Any

from core.errors import OpenAIError
from gateway.anthropic_api.errors import error_body
from gateway.anthropic_api.reply import stop_fields, tool_use_id, usage_of
from gateway.chat_bridge import Event


class BlockWriter:
    def __init__(self, message_id: str, model: str) -> None:
        self._message = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
                         "stop_reason": None, "stop_sequence": None, "usage": usage_of(None)}  # fmt: skip
        self._index = -1  # the open block's index; -1: none open
        self._open: tuple[str, int] | None = None  # ("text", 0) or ("tool", chat tool-call index)
        self._matched: Any = None  # the stop string that ended the answer (vLLM's choice.stop_reason)
        self._message_sent = False

    def start(self) -> list[Event]:
        return []  # message_start waits for the first chunk, which may carry the prompt's usage

    def _started(self, usage: dict[str, Any] | None) -> list[Event]:
        if self._message_sent:
            return []
        self._message_sent = True
        return [{"type": "message_start", "message": {**self._message, "usage": usage_of(usage)}}]

    def on_chunk(self, chunk: dict[str, Any]) -> list[Event]:
        events: list[Event] = self._started({**(chunk.get("usage") or {}), "completion_tokens": 0})
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            self._matched = choice.get("stop_reason", self._matched)
            if delta.get("content"):
                events += self._switch(("text", 0), {"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                block = {
                    "type": "tool_use",
                    "id": tool_use_id(call.get("id")),
                    "name": function.get("name"),
                    "input": {},
                }
                events += self._switch(("tool", call.get("index", 0)), block)
                if function.get("arguments"):
                    events.append(
                        self._delta({"type": "input_json_delta", "partial_json": function["arguments"]})
                    )
        return events

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[Event]:
        events = [*self._started(None), *self._close()]
        delta = stop_fields(finish_reason, self._matched)
        events.append({"type": "message_delta", "delta": delta, "usage": usage_of(usage)})
        events.append({"type": "message_stop"})
        return events

    def failure(self, error: OpenAIError) -> Event:
        return error_body(error)

    def _switch(self, block: tuple[str, int], content_block: dict[str, Any]) -> list[Event]:
        if self._open == block:
            return []
        events = self._close()
        self._open, self._index = block, self._index + 1
        events.append({"type": "content_block_start", "index": self._index, "content_block": content_block})
        return events

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}
