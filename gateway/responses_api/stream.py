"""Chat chunks → the Responses event stream: response.created, response.in_progress, output_item.added,
content_part.added, output_text.delta ... output_text.done, content_part.done, output_item.done (function
calls: function_call_arguments.delta/.done), and response.completed (or response.incomplete)."""

from typing import Any

from core.errors import OpenAIError
from gateway.chat_bridge import Event
from gateway.responses_api import reply


class EventWriter:
    """Keeps the output items being built and numbers the events."""

    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response
        self._prefix = response["id"].removeprefix("resp_")
        self._sequence = 0
        self._text: dict[str, Any] | None = None  # the open message item, with its text so far
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index → open function_call item
        self.items: list[dict[str, Any]] = []  # every output item, in output order

    def event(self, kind: str, **fields: Any) -> Event:
        self._sequence += 1
        return {"type": kind, "sequence_number": self._sequence - 1, **fields}

    def start(self) -> list[Event]:
        return [self.event("response.created", response=dict(self.response)),
                self.event("response.in_progress", response=dict(self.response))]  # fmt: skip

    def on_chunk(self, chunk: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text_delta(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call_delta(call)
        return events

    def _text_delta(self, text: str) -> list[Event]:
        events: list[Event] = []
        if self._text is None:
            item = reply.message_item(f"msg_{self._prefix}_{len(self.items)}", "", status="in_progress")
            self._text = {"item": item, "index": len(self.items), "text": ""}
            self.items.append(item)
            events.append(
                self.event("response.output_item.added", output_index=self._text["index"], item=item)
            )
            events.append(self.event("response.content_part.added", **self._where(self._text),
                                     part=reply.text_part("")))  # fmt: skip
        self._text["text"] += text
        events.append(
            self.event("response.output_text.delta", **self._where(self._text), delta=text, logprobs=[])
        )
        return events

    def _call_delta(self, call: dict[str, Any]) -> list[Event]:
        function = call.get("function") or {}
        index = call.get("index", 0)
        events: list[Event] = []
        if index not in self._calls:
            position = len(self.items)
            item = reply.function_call_item(f"fc_{self._prefix}_{position}", call.get("id") or f"call_{self._prefix}_{index}",
                                            function.get("name") or "", "", status="in_progress")  # fmt: skip
            self._calls[index] = {"item": item, "index": position}
            self.items.append(item)
            events.append(self.event("response.output_item.added", output_index=position, item=dict(item)))
        state = self._calls[index]
        if function.get("arguments"):
            state["item"]["arguments"] += function["arguments"]
            events.append(self.event("response.function_call_arguments.delta", item_id=state["item"]["id"],
                                     output_index=state["index"], delta=function["arguments"]))  # fmt: skip
        return events

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[Event]:
        events: list[Event] = []
        if self._text is not None:
            state, text = self._text, self._text["text"]
            part = reply.text_part(text)
            events.append(
                self.event("response.output_text.done", **self._where(state), text=text, logprobs=[])
            )
            events.append(self.event("response.content_part.done", **self._where(state), part=part))
            state["item"].update(status=reply.item_status(finish_reason), content=[part])
            events.append(
                self.event("response.output_item.done", output_index=state["index"], item=state["item"])
            )
        for state in self._calls.values():
            item = state["item"]
            item["status"] = reply.item_status(finish_reason)
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=state["index"], name=item["name"], arguments=item["arguments"]))  # fmt: skip
            events.append(self.event("response.output_item.done", output_index=state["index"], item=item))
        if not self.items:  # an empty answer is still one (empty) message
            self.items.append(reply.message_item(f"msg_{self._prefix}_0", ""))
        reply.finish(self.response, self.items, finish_reason, usage)
        kind = "response.completed" if self.response["status"] == "completed" else "response.incomplete"
        events.append(self.event(kind, response=self.response))
        return events

    def failure(self, error: OpenAIError) -> Event:
        """The `error` event. It also carries OpenAI's error object, which makes the SDKs raise APIError."""
        details = error.to_dict()["error"]
        return self.event("error", code=error.code or error.type, message=error.message, param=error.param,
                          error=details)  # fmt: skip

    @staticmethod
    def _where(state: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": state["item"]["id"], "output_index": state["index"], "content_index": 0}
