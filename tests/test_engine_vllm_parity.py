"""The engine's OpenAI server answers as vLLM's does: `stop_reason` on every choice (the stop string, the stop
token id, null), `chatcmpl-` ids for chat, a max_tokens set that does not fit is a 400, a tool call cut short
is a tool call (never the engine's internal call JSON as text). Fake model over real HTTP: after the prompt
"a" it writes the tokens 10, 2, 1, 9, 10, 2, ... as "<10><2><1><9>..."."""

from typing import Any

import fake_engine_server
import httpx
import orjson
import pytest
import torch
from test_engine_serving_fakes import EOS, VOCAB, FakeDetokenizer, FakeRunner, fake_probs

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.llm_engine import LLMEngine
from backends.local_engine.engine.outputs import RequestOutput
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.server.protocol import Completion
from backends.local_engine.server.tools import tool_request

server = fake_engine_server.server  # the fixture

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "a"}], "temperature": 0}
COMPLETION = {"model": "fake", "prompt": "a", "temperature": 0}


def _body(endpoint: str, **extra: Any) -> dict[str, Any]:
    return {**(CHAT if endpoint == "chat/completions" else COMPLETION), **extra}


def _post(server, endpoint: str, **extra: Any) -> dict[str, Any]:
    response = httpx.post(f"{server[0]}/v1/{endpoint}", json=_body(endpoint, **extra))
    assert response.status_code == 200, response.text
    return response.json()


def _stream(server, endpoint: str, **extra: Any) -> list[dict[str, Any]]:
    body = _body(endpoint, stream=True, **extra)
    with httpx.stream("POST", f"{server[0]}/v1/{endpoint}", json=body) as response:
        assert response.status_code == 200, response.read()
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


ENDPOINTS = ["chat/completions", "completions"]
STOPS = [
    ({"stop": ["<1>"], "max_tokens": 8}, "stop", "<1>"),
    ({"stop_token_ids": [1], "max_tokens": 8}, "stop", 1),
    ({"max_tokens": 2}, "length", None),
]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(("extra", "finish", "reason"), STOPS)
def test_every_choice_says_what_stopped_it(
    server, endpoint: str, extra: dict, finish: str, reason: Any
) -> None:
    (choice,) = _post(server, endpoint, **extra)["choices"]
    assert (choice["finish_reason"], choice["stop_reason"]) == (finish, reason)
    assert "stop_reason" in choice
    if "stop" in extra:
        text = choice["message"]["content"] if endpoint == "chat/completions" else choice["text"]
        assert text == "<10><2>"


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(("extra", "finish", "reason"), STOPS)
def test_every_streamed_choice_says_what_stopped_it(
    server, endpoint: str, extra: dict, finish: str, reason: Any
) -> None:
    choices = [choice for chunk in _stream(server, endpoint, **extra) for choice in chunk["choices"]]
    assert all("stop_reason" in choice for choice in choices)
    *before, last = choices
    assert all(c["finish_reason"] is None and c["stop_reason"] is None for c in before)
    assert (last["finish_reason"], last["stop_reason"]) == (finish, reason)


def test_the_end_of_sequence_token_is_no_stop_reason_but_a_stop_token_id_is() -> None:
    runner = FakeRunner()
    runner._row = lambda context: torch.nn.functional.one_hot(torch.tensor(EOS), VOCAB).float()  # type: ignore[method-assign]
    engine = LLMEngine(EngineSettings(max_model_len=64), runner, fake_probs, FakeDetokenizer)
    eos = engine.add_request([1], SamplingParams(max_tokens=4, temperature=0))
    listed = engine.add_request([1], SamplingParams(max_tokens=4, temperature=0, stop_token_ids=[EOS]))
    ignored = engine.add_request(
        [1], SamplingParams(max_tokens=4, temperature=0, stop_token_ids=[EOS], ignore_eos=True)
    )
    finals = {o.seq_id: o for step in iter(engine.step, []) for o in step if o.finished}
    assert [(finals[i].finish_reason, finals[i].stop_reason) for i in (eos, listed, ignored)] == [
        ("stop", None),  # the end of sequence first, as vLLM checks it
        ("stop", None),
        ("stop", EOS),  # ignored as an end of sequence, a stop token all the same
    ]


@pytest.mark.parametrize(
    ("endpoint", "prefix"), [("chat/completions", "chatcmpl-"), ("completions", "cmpl-")]
)
def test_ids_take_the_endpoint_prefix_streamed_or_not(server, endpoint: str, prefix: str) -> None:
    whole = _post(server, endpoint, max_tokens=2, n=2)
    chunks = _stream(server, endpoint, max_tokens=2, n=2, stream_options={"include_usage": True})
    assert whole["id"].startswith(prefix)
    assert len({chunk["id"] for chunk in chunks}) == 1 and chunks[0]["id"].startswith(prefix)
    assert chunks[0]["id"] != whole["id"]


def _refusal(server, endpoint: str, **extra: Any) -> dict[str, Any]:
    response = httpx.post(f"{server[0]}/v1/{endpoint}", json=_body(endpoint, **extra))
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    ("endpoint", "prompt_param", "field"),
    [
        ("chat/completions", "messages", "max_tokens"),
        ("chat/completions", "messages", "max_completion_tokens"),
        ("completions", "prompt", "max_tokens"),
    ],
)
def test_a_max_tokens_set_that_does_not_fit_is_a_400(
    server, endpoint: str, prompt_param: str, field: str
) -> None:
    """The fake server's context is 128 tokens; the prompt "a" is 1."""
    error = _refusal(server, endpoint, **{field: 128})
    assert error["message"] == (
        "This model's maximum context length is 128 tokens. However, you requested 129 tokens "
        "(1 in the messages, 128 in the completion). Please reduce the length of the messages or completion."
    )
    assert (error["param"], error["code"]) == (field, "context_length_exceeded")
    (choice,) = _post(server, endpoint, **{field: 127, "stop": ["<1>"]})["choices"]  # fits exactly
    assert choice["finish_reason"] == "stop"
    long = (
        {"messages": [{"role": "user", "content": "a" * 130}]}
        if prompt_param == "messages"
        else {"prompt": "a" * 130}
    )
    error = _refusal(server, endpoint, max_tokens=5, **long)  # the prompt alone is too long: it is named
    assert (error["param"], error["code"]) == (prompt_param, "context_length_exceeded")
    assert "However, you requested 135 tokens (130 in the messages, 5 in the completion)" in error["message"]


def test_without_max_tokens_the_answer_takes_what_is_left_of_the_context(server) -> None:
    choice, usage = (reply := _post(server, "completions", prompt="a" * 120))["choices"][0], reply["usage"]
    assert choice["finish_reason"] == "length" and usage == {
        **usage,
        "prompt_tokens": 120,
        "completion_tokens": 8,
    }
    error = _refusal(
        server, "completions", prompt=["a", "a" * 120], max_tokens=9
    )  # a batch: every prompt fits
    assert error["param"] == "max_tokens" and "(120 in the messages, 9 in the completion)" in error["message"]


TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}]  # fmt: skip


def _answer(tool_choice: Any, pieces: list[str], finish: str, stream: bool) -> tuple[dict[str, Any], str]:
    """The chat choice's message (a streamed one's deltas merged) and finish_reason for an answer of `pieces`."""
    tools = tool_request({"tools": TOOLS, "tool_choice": tool_choice})
    completion = Completion("chat", "m", str, tools=tools)
    outputs = [RequestOutput(1, [i], text, [], None, 5, 0, i + 1) for i, text in enumerate(pieces)]
    outputs[-1].finish_reason = finish
    if not stream:
        for output in outputs:
            completion.add(output)
        choice = completion.choice()
        return choice["message"], choice["finish_reason"]
    chunks = [chunk for chunk in map(completion.chunk, outputs) if chunk is not None]
    message: dict[str, Any] = {}
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        message |= {**delta, "content": message.get("content", "") + (delta.get("content") or "")}
    return message, chunks[-1]["choices"][0]["finish_reason"]


FORCED = ["required", {"type": "function", "function": {"name": "get_time"}}]
CUT = ['{"name": "get_time", ', '"arguments": {"zo']


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", FORCED)
def test_a_forced_call_cut_short_is_a_tool_call_with_its_partial_arguments(
    tool_choice: Any, stream: bool
) -> None:
    message, finish = _answer(tool_choice, CUT, "length", stream)
    assert finish == "length" and not message.get("content")
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_time", "arguments": '{"zo'}
    message, finish = _answer(tool_choice, CUT[:1], "length", stream)  # the name whole, no arguments yet
    assert finish == "length" and message["tool_calls"][0]["function"] == {
        "name": "get_time",
        "arguments": "",
    }


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("tool_choice", "pieces"), [
    ("required", ['{"na', 'me": "get_t']),
    ({"type": "function", "function": {"name": "get_time"}}, ['{"name"']),
    ("auto", ["<tool_", "call>"]),
    ("auto", ["<tool_call>", '{"name": "get']),
])  # fmt: skip
def test_a_forced_call_cut_before_its_name_is_an_empty_message(
    tool_choice: Any, pieces: list[str], stream: bool
) -> None:
    message, finish = _answer(tool_choice, pieces, "length", stream)
    assert finish == "length" and not message.get("content") and not message.get("tool_calls")
    assert "name" not in str(message)


@pytest.mark.parametrize("stream", [False, True])
def test_an_auto_call_cut_short_is_a_tool_call_and_text_stays_text(stream: bool) -> None:
    message, finish = _answer("auto", ["<tool_call>", *CUT], "length", stream)
    assert finish == "length" and message["tool_calls"][0]["function"] == {
        "name": "get_time",
        "arguments": '{"zo',
    }
    message, finish = _answer("auto", ["Sunny", " tod"], "length", stream)
    assert (message["content"], finish) == ("Sunny tod", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_a_whole_call_is_still_a_tool_calls_finish(stream: bool) -> None:
    message, finish = _answer("required", [*CUT, 'ne": "UTC"}}'], "stop", stream)
    assert finish == "tool_calls"
    assert message["tool_calls"][0]["function"] == {"name": "get_time", "arguments": '{"zone":"UTC"}'}
