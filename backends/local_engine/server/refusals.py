"""What the engine refuses with a 400 rather than answer while ignoring it: tools and JSON modes without a
grammar compiler, guided decoding, and the OpenAI and vLLM parameters whose meaning it cannot give."""

from typing import Any

from core.errors import bad_request

JSON_MODES = ("json_object", "json_schema")

_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")


def refuse_what_cannot_be_honoured(body: dict[str, Any], json_modes: bool = False) -> None:
    """Guided decoding (and tools and JSON modes, without a grammar compiler for the model's tokenizer) are
    refused with a 400 rather than answered with free text that ignores them (tools.py refuses the rest)."""
    kind = _response_format_type(body.get("response_format") or {})
    calls = body.get("tools") and body.get("tool_choice", "auto") != "none"
    if (calls or body.get("functions")) and not json_modes:
        param = "tools" if body.get("tools") else "functions"
        raise bad_request("This engine cannot call tools with this model: send tool_choice 'none' or use a "
                          "deployment that supports tool calling.", param=param, code="unsupported_parameter")  # fmt: skip
    if calls and kind != "text":
        raise bad_request("This engine cannot combine tool calls with a JSON response_format.",
                          param="response_format", code="unsupported_parameter")  # fmt: skip
    if kind != "text" and not json_modes:
        raise bad_request(f"This engine cannot guarantee response_format {kind!r} with this model (no grammar "
                          "compiler for its tokenizer).", param="response_format", code="unsupported_parameter")  # fmt: skip
    for name in _GUIDED:
        if body.get(name) is not None:
            raise bad_request(
                f"This engine does not support {name}.", param=name, code="unsupported_parameter"
            )
    for name, message in _unsupported(body):
        raise bad_request(message, param=name, code="unsupported_parameter")


def _response_format_type(given: Any) -> str:
    """The response_format's type; a 400 for one that is not an object or not one of OpenAI's (and vLLM's)."""
    if not isinstance(given, dict):
        raise bad_request("Invalid type for 'response_format': expected an object.", param="response_format",
                          code="invalid_type")  # fmt: skip
    kind = given.get("type", "text")
    if kind not in ("text", *JSON_MODES):
        raise bad_request(f"Invalid value for 'response_format.type': {kind!r}. Supported values are: 'text', "
                          "'json_object' and 'json_schema'.", param="response_format.type", code="invalid_value")  # fmt: skip
    return kind


def _unsupported(body: dict[str, Any]) -> list[tuple[str, str]]:
    """Parameters whose meaning this engine cannot give, as (param, message): refused, never ignored."""
    n, best_of = body.get("n") or 1, body.get("best_of")
    checks = [
        ("best_of", best_of is not None and best_of != n,
         f"This engine returns every choice it generates: best_of must equal n ({n})."),
        ("suffix", bool(body.get("suffix")), "This engine cannot insert text: suffix is not supported."),
        ("audio", body.get("audio") is not None or "audio" in (body.get("modalities") or ()),
         "This engine answers in text only: audio output is not supported."),
        ("web_search_options", body.get("web_search_options") is not None, "This engine cannot search the web."),
        ("continue_final_message",
         bool(body.get("continue_final_message")) and body.get("add_generation_prompt") is True,
         "continue_final_message and add_generation_prompt cannot both be true."),
        ("spaces_between_special_tokens",
         body.get("spaces_between_special_tokens") is False and body.get("skip_special_tokens") is False,
         "This engine's tokenizers cannot leave out the spaces between special tokens."),
    ]  # fmt: skip
    return [(name, message) for name, refused, message in checks if refused]
