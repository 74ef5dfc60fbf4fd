"""Tool calls in our engine on the real SmolLM2: tool_choice "required" and named give OpenAI `tool_calls`
whose arguments parse and validate, streamed too; "auto" and unknown names are a clear 400."""

import json
import os
from typing import Any

import jsonschema
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("llguidance")

from backends.local_engine.config import EngineSettings  # noqa: E402
from backends.local_engine.detokenizer import IncrementalDetokenizer  # noqa: E402
from backends.local_engine.engine import LLMEngine  # noqa: E402
from backends.local_engine.protocol import Completion, sampling_params  # noqa: E402
from backends.local_engine.sampler import probabilities  # noqa: E402
from backends.local_engine.structured import grammars_for  # noqa: E402
from backends.local_engine.tools import tool_request, with_tools_prompt  # noqa: E402
from gateway.errors import OpenAIError  # noqa: E402

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}  # fmt: skip
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone", "parameters": TIME}},
]  # fmt: skip
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
CHAT = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
    "tools": TOOLS,
}


@pytest.fixture(scope="module")
def runner():
    from backends.local_engine.model_runner import ModelRunner

    return ModelRunner(EngineSettings(dtype="fp32", kv_cache_memory_mb=64, max_model_len=512))


@pytest.fixture(scope="module")
def grammars(runner):
    return grammars_for(runner.tokenizer)


def answer(runner, grammars, body: dict[str, Any], stream: bool) -> tuple[Completion, list[dict[str, Any]]]:
    """Runs `body` through the engine the way the server does; returns the completion and its stream chunks."""
    settings = EngineSettings(max_model_len=512, max_num_batched_tokens=128, max_num_seqs=4)
    llm = LLMEngine(
        settings, runner, probabilities, lambda p, params: IncrementalDetokenizer(runner.tokenizer, p, params)
    )
    body = {"temperature": 0, "max_tokens": 60, **body}
    params = sampling_params("chat", body, 60, grammars)
    messages = with_tools_prompt(body["messages"], tool_request(body))
    llm.add_request(runner.tokenizer.encode_chat(messages), params)
    completion, chunks = Completion("chat", "smollm2", lambda t: "", tools=True), []
    while llm.has_work:
        for out in llm.step():
            if stream:
                chunks += [c for c in [completion.chunk(out)] if c is not None]
            else:
                completion.add(out)
    return completion, chunks


def test_required_gives_a_valid_tool_call(runner, grammars) -> None:
    completion, _ = answer(runner, grammars, {**CHAT, "tool_choice": "required"}, stream=False)
    choice = completion.response()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", completion.text
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    name = call["function"]["name"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


def test_named_tool_streams_as_delta_tool_calls(runner, grammars) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    _, chunks = answer(runner, grammars, {**CHAT, "tool_choice": choice}, stream=True)
    (last,) = chunks  # nothing until the call is complete, then the whole call at once
    assert last["choices"][0]["finish_reason"] == "tool_calls"
    (call,) = last["choices"][0]["delta"]["tool_calls"]
    assert call["index"] == 0 and call["function"]["name"] == "get_time"
    jsonschema.validate(json.loads(call["function"]["arguments"]), TIME)


def test_named_schema_allows_only_that_tool() -> None:
    request = tool_request({**CHAT, "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert request is not None
    assert request.schema()["properties"]["name"] == {"const": "get_time"}
    assert [
        o["properties"]["name"] for o in tool_request({**CHAT, "tool_choice": "required"}).schema()["anyOf"]
    ] == [
        {"const": "get_weather"},
        {"const": "get_time"},
    ]


@pytest.mark.parametrize(("extra", "param"), [
    ({}, "tool_choice"),  # "auto", the default
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools"),
])  # fmt: skip
def test_what_tools_cannot_honour_is_400(grammars, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as error:
        sampling_params("chat", {**CHAT, **extra}, 16, grammars)
    assert (error.value.status, error.value.param) == (400, param)


def test_the_tools_are_described_in_the_system_prompt() -> None:
    request = tool_request({**CHAT, "tool_choice": "required"})
    assert request is not None
    messages = with_tools_prompt([{"role": "system", "content": "Be brief."}, *CHAT["messages"]], request)
    assert len(messages) == 2 and messages[0]["content"].startswith("Be brief.")
    assert "get_weather" in messages[0]["content"] and "Weather in a city" in messages[0]["content"]
