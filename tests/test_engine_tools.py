"""Tool calls in our engine on the real SmolLM2: tool_choice "required" and named give OpenAI `tool_calls`
whose arguments parse and validate, streamed too; "auto" answers text or a call; bad choices are a 400."""

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("llguidance")

import openai  # noqa: E402

from backends.local_engine.config import EngineSettings  # noqa: E402
from backends.local_engine.engine.outputs import RequestOutput  # noqa: E402
from backends.local_engine.server.protocol import Completion, sampling_params  # noqa: E402
from backends.local_engine.server.serve import load_local_engine  # noqa: E402
from backends.local_engine.server.server import create_app  # noqa: E402
from backends.local_engine.server.tools import closed, tool_request, with_tools_prompt  # noqa: E402
from core.errors import OpenAIError  # noqa: E402
from tests.fakes import ServerThread  # noqa: E402

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
def engine() -> Iterator[ServerThread]:
    """The engine's own server on the real SmolLM2 (fp32)."""
    settings = EngineSettings(
        dtype="fp32", kv_cache_memory_mb=64, max_model_len=512, max_num_batched_tokens=128
    )
    with ServerThread(create_app(lambda: load_local_engine(settings))) as server:
        deadline = time.monotonic() + 300
        while httpx.get(server.url + "/health", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the engine did not load"
            time.sleep(0.2)
        yield server


@pytest.fixture(scope="module")
def client(engine: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def grammars(engine: ServerThread) -> Any:
    return engine.server.config.app.state.engine_state.loaded.model.grammars


def ask(client: openai.OpenAI, tool_choice: Any) -> Any:
    """One greedy, non-streamed answer to CHAT with `tool_choice`: its only choice."""
    response = client.chat.completions.create(
        model="smollm2",
        messages=CHAT["messages"],
        tools=TOOLS,
        tool_choice=tool_choice,
        temperature=0,
        max_tokens=60,
    )
    return response.choices[0]


def test_required_gives_a_valid_tool_call(client: openai.OpenAI) -> None:
    choice = ask(client, "required")
    assert choice.finish_reason == "tool_calls", choice.message
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_named_tool_streams_as_delta_tool_calls(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="smollm2", messages=CHAT["messages"], tools=TOOLS, temperature=0, max_tokens=60, stream=True,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
    )  # fmt: skip
    opening, last = chunks  # the role, then nothing until the call is complete, then the whole call at once
    assert opening.choices[0].delta.role == "assistant"
    assert last.choices[0].finish_reason == "tool_calls"
    (call,) = last.choices[0].delta.tool_calls
    assert call.index == 0 and call.id.startswith("call_") and call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME)


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
    ({"tool_choice": "any"}, "tool_choice"),
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


def test_auto_answers_text_or_a_valid_call(client: openai.OpenAI) -> None:
    choice = ask(client, "auto")
    if choice.finish_reason == "tool_calls":
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    else:
        assert choice.message.content and not choice.message.content.startswith("<")


def stream(completion: Completion, pieces: list[str]) -> list[dict[str, Any]]:
    outputs = [RequestOutput(1, [i], text, [], None, 5, 0, i + 1) for i, text in enumerate(pieces)]
    outputs[-1].finish_reason = "stop"
    return [c for c in map(completion.chunk, outputs) if c is not None]


def test_auto_streams_text_at_once_and_holds_a_call_back() -> None:
    auto = tool_request({**CHAT, "tool_choice": "auto"})
    assert auto is not None and auto.auto
    text = stream(Completion("chat", "m", str, tools=auto), ["", "Sunny", " today"])
    assert [c["choices"][0]["delta"] for c in text] == [{"content": "Sunny"}, {"content": " today"}]
    assert text[-1]["choices"][0]["finish_reason"] == "stop"
    pieces = ["<tool_call>", '{"name": "get_time", ', '"arguments": {"zone": "UTC"}}']
    (call,) = stream(Completion("chat", "m", str, tools=auto), pieces)
    assert call["choices"][0]["finish_reason"] == "tool_calls"
    assert call["choices"][0]["delta"]["tool_calls"][0]["function"] == {
        "name": "get_time",
        "arguments": '{"zone":"UTC"}',
    }
    held = Completion("chat", "m", str, tools=auto)
    for piece in pieces:
        held.add(RequestOutput(1, [0], piece, [], None, 5, 0, 1))
    held.last.finish_reason = "stop"  # type: ignore[union-attr]
    assert held.choice()["message"]["tool_calls"][0]["function"]["name"] == "get_time"


def test_auto_grammar_allows_text_or_marker_and_call(grammars: Any) -> None:
    import torch

    lltok = grammars.tokenizer()
    for text, whole in [
        ('<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}', True),
        ("Sunny", False),
    ]:
        constraint = sampling_params("chat", {**CHAT, "tool_choice": "auto"}, 16, grammars).constraint
        logits = torch.zeros(lltok.vocab_size)
        constraint.mask(logits, lltok.tokenize_str(text))
        allowed = int((~torch.isinf(logits)).sum())
        assert (allowed == 1) if whole else (allowed > 1000)  # a whole call: only EOS; text: goes on freely
    constraint = sampling_params("chat", {**CHAT, "tool_choice": "auto"}, 16, grammars).constraint
    logits = torch.zeros(lltok.vocab_size)
    constraint.mask(logits, lltok.tokenize_str("<tool_call>"))
    assert int((~torch.isinf(logits)).sum()) < 100  # after the marker: only the start of a call


def test_argument_objects_are_closed_unless_they_say_otherwise() -> None:
    schema = {
        "type": "object",
        "properties": {
            "place": {"type": "object", "properties": {"city": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "extra": {"type": "object", "properties": {}, "additionalProperties": True},
            "free": {"type": "object"},
        },
        "$defs": {"unit": {"type": "object", "properties": {"u": {"type": "string"}}}},
    }
    out = closed(schema)
    assert out["additionalProperties"] is False and "additionalProperties" not in schema  # a copy
    assert out["properties"]["place"]["additionalProperties"] is False
    assert out["properties"]["tags"]["items"]["additionalProperties"] is False
    assert out["$defs"]["unit"]["additionalProperties"] is False
    assert out["properties"]["extra"]["additionalProperties"] is True  # said: kept
    assert "additionalProperties" not in out["properties"]["free"]  # no properties listed: a free-form map
    request = tool_request({**CHAT, "tool_choice": "required"})
    assert request is not None and all(
        o["properties"]["arguments"]["additionalProperties"] is False for o in request.schema()["anyOf"]
    )
    assert (
        "additionalProperties"
        not in with_tools_prompt(CHAT["messages"], request)[0]["content"].split("get_time")[1]
    )


def test_a_forced_call_cannot_invent_argument_keys(grammars: Any) -> None:
    import torch

    lltok = grammars.tokenizer()
    body = {**CHAT, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    constraint = sampling_params("chat", body, 16, grammars).constraint
    logits = torch.zeros(lltok.vocab_size)
    constraint.mask(logits, lltok.tokenize_str('{"name": "get_time", "arguments": {"zone": "UTC"'))
    comma, brace = lltok.tokenize_str(","), lltok.tokenize_str("}")
    assert len(comma) == 1 and torch.isinf(logits[comma[0]])  # TIME says nothing of additional keys: closed
    assert not torch.isinf(logits[brace[0]])


def _cut(client: openai.OpenAI, max_tokens: int, stream: bool) -> tuple[Any, str]:
    """A call forced to get_weather, cut by max_tokens: (tool_calls or None, finish_reason); streamed, the
    deltas after the opening one."""
    request = dict(
        model="smollm2", messages=CHAT["messages"], tools=TOOLS, temperature=0, max_tokens=max_tokens,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    if not stream:
        (choice,) = client.chat.completions.create(**request).choices
        assert not choice.message.content
        return choice.message.tool_calls, choice.finish_reason
    _, *rest = client.chat.completions.create(**request, stream=True)
    (last,) = rest  # held back until the end, then at once
    assert not last.choices[0].delta.content
    return last.choices[0].delta.tool_calls, last.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_cut_by_max_tokens_is_a_tool_call_never_text(
    client: openai.OpenAI, stream: bool
) -> None:
    calls, finish = _cut(client, 14, stream)
    (call,) = calls
    assert finish == "length" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert call.function.arguments.startswith("{") and '"name"' not in call.function.arguments
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)  # partial, as OpenAI sends a truncated call's
    assert _cut(client, 3, stream) == (None, "length")  # not even the name: an empty message
