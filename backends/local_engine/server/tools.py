"""Function calling in our engine: `tools` with `tool_choice` "auto", "required" or a named function.

The model is told about the tools in one system-prompt line (SmolLM2's chat template has no tool syntax),
and its answer is constrained (structured.py, llguidance) to `{"name": <a tool's name>, "arguments": <that
tool's parameters schema>}`: one schema per tool, `anyOf` when several may be called. Under "auto" the answer
is either text (not starting with "<") or `<tool_call>` followed by such a call (a Lark grammar). A call
becomes an OpenAI `tool_calls` message.

In the grammar, object schemas of the arguments that say nothing of `additionalProperties` are closed (as
OpenAI's `strict` mode has them): left open, SmolLM2 filled a forced call's arguments with invented keys
("description", "parameters", ...) until max_tokens cut it, so LangChain's `bind_tools` got no call at all.
"""

import re
import secrets
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import orjson

from backends.local_engine.loading.chat_template import text_messages
from core.errors import bad_request

_NO_PARAMETERS = {"type": "object", "properties": {}}
MARKER = "<tool_call>"


@dataclass(frozen=True)
class ToolRequest:
    """The tools a request offers and, for a named tool_choice, the one it must call."""

    tools: list[dict[str, Any]]
    forced: str | None = None
    auto: bool = False  # text or a call, the model's choice

    def schema(self) -> dict[str, Any]:
        """The JSON schema every answer must follow."""
        allowed = [t for t in self.tools if self.forced in (None, t["name"])]
        options = [_call_schema(t) for t in allowed]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def lark(self) -> str:
        """Under "auto": free text that does not start with "<", or the marker and a call."""
        call = orjson.dumps(self.schema()).decode()
        return f'start: TEXT | "{MARKER}" call\nTEXT: /[^<][\\s\\S]*/\ncall: %json {call}\n'

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """The OpenAI `tool_calls` for a whole answer; None when it is text or a call cut short."""
        if self.auto:
            if not text.startswith(MARKER):
                return None
            text = text[len(MARKER) :]
        return tool_calls(text)

    def calls_so_far(self, text: str) -> list[dict[str, Any]]:
        """An answer that ended (max_tokens, a stop string) before its call was whole: the call so far, with
        the arguments' partial JSON text as OpenAI returns a truncated call; [] before its name is whole."""
        if self.auto:
            if not text.startswith(MARKER):
                return []
            text = text[len(MARKER) :]
        named = _NAMED.match(text)
        if named is None or (name := orjson.loads(named[1])) not in {t["name"] for t in self.tools}:
            return []
        rest = text[named.end() :]
        arguments = _ARGUMENTS.match(rest)
        return [_call(name, rest[arguments.end() :] if arguments else "")]


# the start of a constrained call, {"name": ..., "arguments": ...} (structured.py writes the name first)
_NAMED = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_ARGUMENTS = re.compile(r'\s*,\s*"arguments"\s*:\s*')


def engine_chat(body: dict[str, Any]) -> tuple[dict[str, Any], ToolRequest | None]:
    """A chat body as the engine renders it: text parts joined, the tools prompt added when tools are offered;
    and the tools to call (None when none)."""
    body = {**body, "messages": [_calls_as_text(m) for m in text_messages(body["messages"])]}
    tools = tool_request(body)
    if tools is not None:
        body = {**body, "messages": with_tools_prompt(body["messages"], tools)}
    return body, tools


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant's earlier `tool_calls` (content "") written as the answer the tools prompt asks for, so
    the model sees what it called before the `tool` results that follow."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or message.get("content") or not isinstance(calls, list):
        return message
    texts = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            texts.append(MARKER + _call_json(function["name"], function.get("arguments")))
    return {**message, "content": "\n".join(texts)}


def _call_json(name: str, arguments: Any) -> str:
    """`{"name", "arguments"}` with the arguments as JSON (OpenAI sends them as a JSON string)."""
    if isinstance(arguments, str):
        with suppress(orjson.JSONDecodeError):
            arguments = orjson.loads(arguments)
    return orjson.dumps({"name": name, "arguments": arguments if arguments is not None else {}}).decode()


def tool_request(body: dict[str, Any]) -> ToolRequest | None:
    """The request's tools to call, None when it offers none (or tool_choice "none"); a 400 for what the
    engine cannot honour: legacy `functions`, an unknown tool_choice or name."""
    if body.get("functions") and body.get("function_call", "auto") != "none":
        raise bad_request("This engine does not support the legacy 'functions'; send 'tools'.",
                          param="functions", code="unsupported_parameter")  # fmt: skip
    tools = [_function(t) for t in body.get("tools") or []]
    choice = body.get("tool_choice", "auto" if tools else "none")
    if not tools or choice == "none":
        return None
    if choice in ("required", "auto"):
        return ToolRequest(tools, auto=choice == "auto")
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in {t["name"] for t in tools}:
            raise bad_request(f"tool_choice names {name!r}, which is not among 'tools'.", param="tool_choice")
        return ToolRequest(tools, forced=name)
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or a named function.",
                      param="tool_choice")  # fmt: skip


def with_tools_prompt(messages: list[dict[str, Any]], request: ToolRequest) -> list[dict[str, Any]]:
    """The conversation with the tools described in the system prompt (appended to one already there)."""
    call = '{"name": ..., "arguments": ...}'
    how = (
        f"to call one, answer {MARKER} then {call}; otherwise answer in text"
        if request.auto
        else f"answer {call}"
    )
    line = f"You can call these functions ({how}):\n"
    line += "\n".join(
        orjson.dumps({k: t[k] for k in ("name", "description", "parameters") if k in t}).decode()
        for t in request.tools
    )
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{line}"}, *messages[1:]]
    return [{"role": "system", "content": line}, *messages]


def tool_calls(text: str) -> list[dict[str, Any]] | None:
    """The OpenAI `tool_calls` for a constrained answer; None when it is not a complete call (cut short)."""
    try:
        call = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
        return None
    return [_call(call["name"], orjson.dumps(call["arguments"]).decode())]


def _call(name: str, arguments: str) -> dict[str, Any]:
    """One OpenAI tool call, `arguments` as JSON text."""
    return {
        "id": f"call_{secrets.token_hex(12)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _function(tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad_request("Each tool must be {'type': 'function', 'function': {'name': ...}}.", param="tools")
    parameters = function.get("parameters") or _NO_PARAMETERS
    if not isinstance(parameters, dict):
        raise bad_request("A tool's 'parameters' must be a JSON schema object.", param="tools")
    return {**function, "parameters": parameters}


def _call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool["name"]}, "arguments": closed(tool["parameters"])},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


_NESTED = ("items", "additionalItems", "not", "if", "then", "else", "contains")
_NESTED_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_NESTED_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object schema that lists properties and says
    nothing of additional ones; everything else unchanged."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _NESTED:
        if key in out:
            out[key] = closed(out[key])
    for key in _NESTED_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    for key in _NESTED_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(s) for name, s in out[key].items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out
