"""An Anthropic Messages request → a chat-completions body."""

from typing import Any

import orjson

from core.errors import bad_request
from core.validation import validate

_SAME = {"model": "model", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "stream": "stream",
         "max_tokens": "max_tokens", "stop_sequences": "stop"}  # fmt: skip
_HANDLED = {"system", "messages", "tools", "tool_choice", "metadata", "output_config", "cache"}
# hints with no chat equivalent and no effect on the answer's content: accepted and dropped
_DROPPED = {"thinking", "service_tier", "cache_control", "inference_geo", "speed", "diagnostics", "user_profile_id",
            "workspace_id"}  # fmt: skip
# the body of count_tokens
_COUNTED = {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config"}
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(body) - set(_SAME) - _HANDLED - _DROPPED)
    if unknown:
        raise bad_request(f"{unknown[0]}: Extra inputs are not permitted", param=unknown[0])
    if "max_tokens" not in body:
        raise bad_request("max_tokens: Field required", param="max_tokens")
    if not isinstance(body["max_tokens"], int) or isinstance(body["max_tokens"], bool):
        raise bad_request("max_tokens: Input should be a valid integer", param="max_tokens")
    temperature = body.get("temperature")
    if (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and not 0 <= temperature <= 1
    ):
        raise bad_request("temperature: Input should be between 0 and 1", param="temperature")
    chat = {target: body[name] for name, target in _SAME.items() if name in body}
    chat["messages"] = _system(body.get("system")) + messages(body.get("messages"))
    _prefill(chat)
    if body.get("tools"):
        chat["tools"] = [_tool(i, t) for i, t in enumerate(_list(body["tools"], "tools"))]
    if body.get("tool_choice") is not None:
        _tool_choice(chat, body["tool_choice"])
    if body.get("output_config") is not None:
        _output_format(chat, body["output_config"])
    user = (body.get("metadata") or {}).get("user_id") if isinstance(body.get("metadata"), dict) else None
    if isinstance(user, str):
        chat["user"] = user
    return chat


def _prefill(chat: dict[str, Any]) -> None:
    """A conversation ending in an assistant turn is a prefill: the model continues that text (vLLM's and our
    engine's continue_final_message), and the answer holds only the continuation, as Anthropic's does."""
    last = chat["messages"][-1] if chat["messages"] else {}
    if last.get("role") != "assistant" or last.get("tool_calls") or not isinstance(last.get("content"), str):
        return
    if last["content"] != last["content"].rstrip():
        raise bad_request("messages: final assistant content cannot end with trailing whitespace",
                          param="messages")  # fmt: skip
    chat["continue_final_message"], chat["add_generation_prompt"] = True, False


def to_counted_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A count_tokens body (a Messages body without max_tokens) → the chat it stands for, validated as one."""
    unknown = sorted(set(body) - _COUNTED)
    if unknown:
        raise bad_request(f"{unknown[0]}: Extra inputs are not permitted", param=unknown[0])
    chat = to_chat({**body, "max_tokens": 1})
    validate("chat", chat)
    return chat


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    blocks = _list(system, "system")
    return [{"role": "system", "content": "".join(_text(b, "system") for b in blocks)}]


def messages(given: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, message in enumerate(_list(given, "messages")):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise bad_request(
                f"messages.{i}.role: Input should be 'user' or 'assistant'", param=f"messages.{i}.role"
            )
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        blocks = _list(content, f"messages.{i}.content")
        out += _assistant(i, blocks) if role == "assistant" else _user(i, blocks)
    return out


def _assistant(i: int, blocks: list[Any]) -> list[dict[str, Any]]:
    text, calls = "", []
    for j, block in enumerate(blocks):
        kind = _kind(block, f"messages.{i}.content.{j}")
        if kind == "text":
            text += _text(block, f"messages.{i}.content.{j}")
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"), "arguments": arguments}})  # fmt: skip
        elif kind not in ("thinking", "redacted_thinking"):
            raise bad_request(
                f"messages.{i}.content.{j}: {kind!r} blocks are not supported in assistant turns"
            )
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _user(i: int, blocks: list[Any]) -> list[dict[str, Any]]:
    """Tool results become `tool` messages, which chat wants before the rest of the user's turn."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        param = f"messages.{i}.content.{j}"
        kind = _kind(block, param)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, param)})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), param)}})
        elif kind == "tool_result":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                            "content": _result_text(block.get("content"), param)})  # fmt: skip
        else:
            raise bad_request(f"{param}: {kind!r} blocks are not supported by this gateway", param=param)
    if not parts:
        return results
    if all(p["type"] == "text" for p in parts):
        return [*results, {"role": "user", "content": "".join(p["text"] for p in parts)}]
    return [*results, {"role": "user", "content": parts}]


def _image_url(source: Any, param: str) -> str:
    if isinstance(source, dict) and source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise bad_request(f"{param}.source: expected a base64 or url image source", param=f"{param}.source")


def _result_text(content: Any, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(_text(b, param) for b in _list(content, f"{param}.content") if b.get("type") == "text")


def _tool(i: int, tool: Any) -> dict[str, Any]:
    if (
        not isinstance(tool, dict)
        or not isinstance(tool.get("name"), str)
        or tool.get("type") not in (None, "custom")
        or not isinstance(tool.get("input_schema"), dict)
    ):
        raise bad_request(f"tools.{i}: only custom tools with a name and an input_schema are supported",
                          param=f"tools.{i}")  # fmt: skip
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(chat: dict[str, Any], choice: Any) -> None:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in _TOOL_CHOICE:
        chat["tool_choice"] = _TOOL_CHOICE[kind]
    else:
        raise bad_request("tool_choice: expected auto, any, none or tool", param="tool_choice")
    if choice.get("disable_parallel_tool_use") and kind != "none":
        chat["parallel_tool_calls"] = False


def _output_format(chat: dict[str, Any], config: Any) -> None:
    """output_config.format (Anthropic's structured outputs) → the chat response_format json_schema."""
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is None:
        return
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise bad_request(
            "output_config.format: expected {type: json_schema, schema}", param="output_config.format"
        )
    chat["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": fmt["schema"]},
    }


def _kind(block: Any, param: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise bad_request(f"{param}: expected a content block with a type", param=param)
    return block["type"]


def _text(block: Any, param: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("text"), str):
        raise bad_request(f"{param}: expected a text block", param=param)
    return block["text"]


def _list(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise bad_request(f"{param}: expected a non-empty list", param=param)
    return value
