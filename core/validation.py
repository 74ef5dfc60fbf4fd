"""Cheap checks on OpenAI request bodies, before anything else runs. Errors read like OpenAI's."""

import re
from typing import Any

import orjson

from core.errors import OpenAIError, bad_request

_SAMPLING = {
    "model", "stream", "stream_options", "temperature", "top_p", "n", "stop", "max_tokens", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "seed", "user", "response_format", "metadata",
}  # fmt: skip
_CHAT_ONLY = {
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
    "functions", "function_call", "store", "service_tier", "modalities", "reasoning_effort", "prediction",
    "audio", "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "verbosity", "web_search_options",
}  # fmt: skip
_COMPLETIONS_ONLY = {"prompt", "echo", "best_of", "suffix"}
_VLLM_EXTRAS = {
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "min_tokens", "skip_special_tokens",
    "include_stop_str_in_output", "spaces_between_special_tokens", "chat_template_kwargs", "add_generation_prompt",
    "continue_final_message", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "priority",
}  # fmt: skip
GATEWAY_EXTENSIONS = {"cache"}  # our own request options; never sent upstream
_ALLOWED = {
    "chat": _SAMPLING | _CHAT_ONLY | _VLLM_EXTRAS | GATEWAY_EXTENSIONS,
    "completions": _SAMPLING | _COMPLETIONS_ONLY | _VLLM_EXTRAS | GATEWAY_EXTENSIONS,
    "embeddings": {"model", "input", "encoding_format", "dimensions", "user"},
}
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "min_p": (0.0, 1.0),
    "repetition_penalty": (0.0, 10.0),
}
_POSITIVE_INTS = ("max_tokens", "max_completion_tokens", "n", "best_of")
_TYPED = {  # vLLM's and legacy fields, by type: a wrong type is a 400 here, as vLLM would answer
    bool: ("echo", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
           "add_generation_prompt", "continue_final_message"),
    dict: ("chat_template_kwargs",),
    int: ("priority", "top_k"),
    str: ("suffix",),
}  # fmt: skip
MAX_CHOICES = 128  # OpenAI's limit on n
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# OpenAI takes 4 stop strings, vLLM any number (evaluation harnesses send more): the upstream applies its own
# limit, the gateway only bounds the work.
MAX_STOPS = 64


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(
            f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from exc
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return body


def validate(endpoint: str, body: dict[str, Any]) -> None:
    """Known fields are checked here; unknown ones (see extra_fields) are for the route stage to place."""
    _check_model(body)
    {"chat": _check_messages, "completions": _check_prompt, "embeddings": _check_input}[endpoint](body)
    if endpoint != "embeddings":
        _check_sampling(body)
    if endpoint == "chat":
        _check_tools(body)


def extra_fields(endpoint: str, body: dict[str, Any]) -> tuple[str, ...]:
    """Fields beyond OpenAI's (and the vLLM ones we know): sent only to deployments that accept extras."""
    return tuple(sorted(set(body) - _ALLOWED[endpoint]))


def unrecognized(name: str) -> OpenAIError:
    return bad_request(f"Unrecognized request argument supplied: {name}", param=name)


def _check_model(body: dict[str, Any]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("you must provide a model parameter (a non-empty string)", param="model")


def _check_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array of message objects.", param="messages")
    for i, message in enumerate(messages):
        _check_message(i, message)


def _check_message(i: int, message: Any) -> None:
    param = f"messages.[{i}]"
    if not isinstance(message, dict):
        raise bad_request(f"Invalid type for '{param}': expected an object.", param=param)
    if not isinstance(message.get("role"), str) or message["role"] not in _ROLES:
        raise bad_request(
            f"Invalid value for '{param}.role': {message.get('role')!r}.", param=f"{param}.role"
        )
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise bad_request(f"Invalid type for '{param}.content': expected a string or an array.", param=param)
    if content is None and message["role"] != "assistant":
        raise bad_request(f"Missing required parameter: '{param}.content'.", param=f"{param}.content")


def _check_prompt(body: dict[str, Any]) -> None:
    prompt = body.get("prompt")
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt)):
        raise bad_request("'prompt' must be a string or a non-empty array.", param="prompt")


def _check_input(body: dict[str, Any]) -> None:
    given = body.get("input")
    if not (isinstance(given, str) and given) and not (isinstance(given, list) and given):
        raise bad_request("'input' must be a non-empty string or array.", param="input")


def _check_sampling(body: dict[str, Any]) -> None:
    for name, (low, high) in _RANGES.items():
        _check_number(body, name, low, high)
    for name in (
        *_POSITIVE_INTS,
        "seed",
        "top_k",
        "priority",
        "min_tokens",
    ):  # JSON Schema's integers include 2.0: take it as 2
        if isinstance(body.get(name), float) and body[name].is_integer() and abs(body[name]) < 2**63:
            body[name] = int(body[name])
    for name in _POSITIVE_INTS:
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise bad_request(f"Invalid '{name}': expected an integer >= 1, got {value!r}.", param=name)
    if (body.get("n") or 1) > MAX_CHOICES:
        raise bad_request(f"Invalid 'n': at most {MAX_CHOICES} choices, got {body['n']}.", param="n")
    _check_type(body, "stream", bool)
    _check_type(body, "stream_options", dict)
    _check_type(body, "seed", int)
    for kind, names in _TYPED.items():
        for name in names:
            _check_type(body, name, kind)
    min_tokens = body.get("min_tokens")
    if min_tokens is not None and (
        not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < 0
    ):
        raise bad_request(
            f"Invalid 'min_tokens': expected an integer >= 0, got {min_tokens!r}.", param="min_tokens"
        )
    if body.get("stream_options") is not None and not body.get("stream"):
        raise bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          param="stream_options")  # fmt: skip
    if body.get("repetition_penalty") == 0:
        raise bad_request(
            "Invalid 'repetition_penalty': it must be greater than 0.", param="repetition_penalty"
        )
    _check_stop(body.get("stop"))
    _check_logit_bias(body.get("logit_bias"))


def _check_tools(body: dict[str, Any]) -> None:
    """Tools named as OpenAI names them (and no name twice); a tool_choice needs tools."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("Invalid type for 'tools': expected an array.", param="tools")
    names: set[str] = set()
    for i, tool in enumerate(tools or []):
        kind = (tool.get("type") or "function") if isinstance(tool, dict) else "function"
        spec = tool.get(kind) if isinstance(tool, dict) else None  # {"type": "function", "function": {...}}
        name, param = spec.get("name") if isinstance(spec, dict) else None, f"tools[{i}].{kind}.name"
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise bad_request(
                f"Invalid '{param}': {name!r} does not match '^[a-zA-Z0-9_-]{{1,64}}$'.", param=param
            )
        if name in names:
            raise bad_request(f"Duplicate tool name {name!r} in 'tools'.", param=param)
        names.add(name)
    if body.get("tool_choice") not in (None, "none") and not tools:
        raise bad_request("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                          "specified.", param="tool_choice")  # fmt: skip


def _check_number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise bad_request(
            f"Invalid '{name}': expected a number between {low} and {high}, got {value!r}.", param=name
        )


def _check_type(body: dict[str, Any], name: str, kind: type) -> None:
    value = body.get(name)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise bad_request(
            f"Invalid type for '{name}': expected {kind.__name__}, got {type(value).__name__}.", param=name
        )


def _check_stop(stop: Any) -> None:
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list) or len(stop) > MAX_STOPS or not all(isinstance(s, str) for s in stop):
        raise bad_request(
            f"'stop' must be a string or an array of at most {MAX_STOPS} strings.", param="stop"
        )


def _check_logit_bias(bias: Any) -> None:
    """A map of token ids (as JSON keys: decimal strings) to a bias between -100 and 100, as OpenAI's."""
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise bad_request("Invalid type for 'logit_bias': expected an object.", param="logit_bias")
    for token, value in bias.items():
        if not token.isdigit() or not token.isascii() or len(token) > 9:
            raise bad_request(
                f"Invalid key in 'logit_bias': {token!r} is not a token id.", param="logit_bias"
            )
        if not isinstance(value, int | float) or isinstance(value, bool) or not -100 <= value <= 100:
            raise bad_request(
                f"Invalid value in 'logit_bias' for token {token}: expected a number between -100 and 100, "
                f"got {value!r}.",
                param="logit_bias",
            )


def upstream_body(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """The body sent to deployments: our extensions removed, usage always requested on streams."""
    clean = {k: v for k, v in body.items() if k not in GATEWAY_EXTENSIONS}
    if stream:
        clean["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return clean


def too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, f"Request body too large: the limit is {limit} bytes.", code="request_too_large")


# What the checks above accept, for the OpenAPI document (gateway/openapi.py).
ALLOWED, RANGES, ROLES, POSITIVE_INTS, TYPED = _ALLOWED, _RANGES, _ROLES, _POSITIVE_INTS, _TYPED
