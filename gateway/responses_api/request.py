"""A Responses API request → a chat-completions body (and what the reply and the store need to know)."""

from dataclasses import dataclass, field
from typing import Any

from core.errors import bad_request

# fields that map onto chat fields of the same meaning
_SAME = ("model", "temperature", "top_p", "stream", "parallel_tool_calls", "user", "safety_identifier",
         "prompt_cache_key", "prompt_cache_retention", "service_tier", "top_logprobs", "seed")  # fmt: skip
# fields the translation itself consumes, or that change nothing on a chat backend
_HANDLED = {"input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "previous_response_id",
            "store", "metadata", "reasoning", "include", "truncation", "background", "stream_options", "cache"}  # fmt: skip
_KNOWN = set(_SAME) | _HANDLED
_ROLES = {"user", "assistant", "system", "developer"}


@dataclass
class Translated:
    chat: dict[str, Any]  # the chat-completions body
    history: list[dict[str, Any]]  # the conversation as chat messages, without instructions (for the store)
    echo: dict[str, Any] = field(default_factory=dict)  # request fields a Response object repeats


def to_chat(body: dict[str, Any], previous: list[dict[str, Any]] | None = None) -> Translated:
    """`previous`: the stored conversation of previous_response_id, as chat messages."""
    _check_fields(body)
    history = [*(previous or []), *input_messages(body.get("input"))]
    _check_call_ids(history)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string.", param="instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    chat: dict[str, Any] = {k: body[k] for k in _SAME if k in body}
    chat["messages"] = system + history
    if body.get("max_output_tokens") is not None:
        given = body["max_output_tokens"]
        if not isinstance(given, int) or isinstance(given, bool) or given < 1:
            raise bad_request(f"Invalid 'max_output_tokens': expected an integer >= 1, got {given!r}.",
                              param="max_output_tokens")  # fmt: skip
        chat["max_tokens"] = given
    if body.get("tools"):
        chat["tools"] = [_tool(i, t) for i, t in enumerate(_list(body["tools"], "tools"))]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _format(body.get("text"))
    if response_format:
        chat["response_format"] = response_format
    effort = (body.get("reasoning") or {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
    if effort:
        chat["reasoning_effort"] = effort
    if body.get("top_logprobs"):
        chat["logprobs"] = True
    echo = {k: body.get(k) for k in ("instructions", "metadata", "previous_response_id", "tool_choice", "tools",
                                     "temperature", "top_p", "max_output_tokens", "text", "user")}  # fmt: skip
    return Translated(chat, history, echo)


def _check_call_ids(history: list[dict[str, Any]]) -> None:
    """Every function_call_output answers a function_call of this conversation, as OpenAI requires."""
    called = {
        call.get("id") for m in history if m["role"] == "assistant" for call in m.get("tool_calls") or []
    }
    for message in history:
        if message["role"] == "tool" and message["tool_call_id"] not in called:
            raise bad_request(f"No tool call found for function call output with call_id "
                              f"{message['tool_call_id']}.", param="input")  # fmt: skip


def _check_fields(body: dict[str, Any]) -> None:
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise bad_request(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    if body.get("background"):
        raise bad_request("background responses are not supported by this gateway.", param="background")
    if body.get("input") is None:
        raise bad_request("Missing required parameter: 'input'.", param="input")


def input_messages(given: Any) -> list[dict[str, Any]]:
    """`input` (a string, or a list of items) as chat messages."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(_list(given, "input")):
        if not isinstance(item, dict):
            raise bad_request(f"Invalid type for 'input[{i}]': expected an object.", param=f"input[{i}]")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(i, item))
        elif kind == "function_call":
            _add_function_call(messages, i, item)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _text_field(item, "call_id", i),
                             "content": _output_text(item.get("output"), i)})  # fmt: skip
        elif kind != "reasoning":  # reasoning items are the model's own notes: nothing to send back
            raise bad_request(f"Input items of type {kind!r} are not supported.", param=f"input[{i}].type")
    return messages


def _message(i: int, item: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise bad_request(f"Invalid value for 'input[{i}].role': {role!r}.", param=f"input[{i}].role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    parts = [_part(i, j, p) for j, p in enumerate(_list(content, f"input[{i}].content"))]
    if role == "assistant" or all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "".join(p.get("text", "") for p in parts)}
    return {"role": role, "content": parts}


def _part(i: int, j: int, part: Any) -> dict[str, Any]:
    param = f"input[{i}].content[{j}]"
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": _text_field(part, "text", i)}
    if kind == "refusal":
        return {"type": "text", "text": str(part.get("refusal", ""))}
    if kind == "input_image":
        if not isinstance(part.get("image_url"), str):
            raise bad_request(
                "Only images given by 'image_url' (a URL or data URL) are supported.", param=param
            )
        image = {"url": part["image_url"], **({"detail": part["detail"]} if part.get("detail") else {})}
        return {"type": "image_url", "image_url": image}
    if kind == "input_file" and isinstance(part.get("file_data"), str):
        return {"type": "file", "file": {k: part[k] for k in ("file_data", "filename") if k in part}}
    raise bad_request(f"Content parts of type {kind!r} are not supported here.", param=param)


def _add_function_call(messages: list[dict[str, Any]], i: int, item: dict[str, Any]) -> None:
    call = {"id": _text_field(item, "call_id", i), "type": "function",
            "function": {"name": _text_field(item, "name", i), "arguments": item.get("arguments") or "{}"}}  # fmt: skip
    last = messages[-1] if messages else None
    if last and last["role"] == "assistant" and not last.get("content") and "tool_calls" in last:
        last["tool_calls"].append(call)  # parallel calls: one assistant turn
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _output_text(output: Any, i: int) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(p.get("text", "") for p in output if isinstance(p, dict))
    raise bad_request(f"'input[{i}].output' must be a string.", param=f"input[{i}].output")


def _tool(i: int, tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise bad_request(f"Only function tools are supported, not {kind!r}.", param=f"tools[{i}].type")
    function = {"name": _text_field(tool, "name", i, "tools")}
    function.update({k: tool[k] for k in ("description", "parameters", "strict") if tool.get(k) is not None})
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request("'tool_choice' must be auto, none, required or a function.", param="tool_choice")


def _format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is not None and not isinstance(fmt, dict):
        raise bad_request("'text.format' must be an object.", param="text.format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise bad_request(
        "'text.format' must be text, json_object or json_schema with a schema.", param="text.format"
    )


def _list(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise bad_request(f"'{param}' must be a non-empty array.", param=param)
    return value


def _text_field(item: dict[str, Any], name: str, i: int, where: str = "input") -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value and name != "text":
        raise bad_request(f"Missing or invalid '{where}[{i}].{name}'.", param=f"{where}[{i}].{name}")
    return value
