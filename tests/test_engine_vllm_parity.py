"""The engine's OpenAI server answers as vLLM's does: `stop_reason` on every choice (the stop string, the stop
token id, null), `chatcmpl-` ids for chat. Fake model over real HTTP: after the prompt "a" it writes the
tokens 10, 2, 1, 9, 10, 2, ... as "<10><2><1><9>..."."""

from typing import Any

import fake_engine_server
import httpx
import orjson
import pytest
import torch
from test_engine_serving_fakes import EOS, VOCAB, FakeDetokenizer, FakeRunner, fake_probs

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine import LLMEngine
from backends.local_engine.sampling_params import SamplingParams

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
