"""The embedded engine refuses what it cannot honour (tools and JSON modes without a grammar compiler, guided
decoding) with a clear 400; tests/test_engine_tools.py covers the tool_choice refusals with one."""

from typing import Any

import pytest

from backends.local_engine.server.protocol import sampling_params
from core.errors import OpenAIError

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [TOOL]}, "tools"),
    ({"tools": [TOOL], "tool_choice": "required"}, "tools"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"guided_choice": ["a", "b"]}, "guided_choice"),
])  # fmt: skip
def test_unhonourable_requests_are_400(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as error:
        sampling_params("chat", {**CHAT, **extra}, 16)
    assert (error.value.status, error.value.param, error.value.code) == (400, param, "unsupported_parameter")


@pytest.mark.parametrize(
    "extra", [{}, {"tools": [TOOL], "tool_choice": "none"}, {"response_format": {"type": "text"}}]
)
def test_what_it_can_honour_passes(extra: dict[str, Any]) -> None:
    assert sampling_params("chat", {**CHAT, **extra}, 16).max_tokens == 16


@pytest.mark.parametrize("grammars", [None, object()])  # with a grammar compiler (JSON modes) or without
@pytest.mark.parametrize(("response_format", "param", "code"), [
    ({"type": "xml"}, "response_format.type", "invalid_value"),
    ({"type": None}, "response_format.type", "invalid_value"),
    ("json", "response_format", "invalid_type"),
])  # fmt: skip
def test_a_response_format_that_is_none_of_openais_is_invalid_not_unsupported(
    grammars: Any, response_format: Any, param: str, code: str
) -> None:
    with pytest.raises(OpenAIError) as error:
        sampling_params("chat", {**CHAT, "response_format": response_format}, 16, grammars)
    assert (error.value.status, error.value.param, error.value.code) == (400, param, code)
    assert "constrained decoding" not in error.value.message and "grammar" not in error.value.message
    if param == "response_format.type":
        assert "'text', 'json_object' and 'json_schema'" in error.value.message
