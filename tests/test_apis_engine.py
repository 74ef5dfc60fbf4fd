"""/v1/responses and /v1/messages in front of our engine's server (the deterministic fake model), and the
engine's 400 for what it cannot honour, carried to each API's clients in their own error shape."""

import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from fake_engine_server import fake_load

from backends.local_engine.server.server import create_app as create_engine_app
from core.models import DeploymentConfig, ModelConfig
from gateway.app import create_app
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import ServerThread

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerThread]:
    with ServerThread(create_engine_app(fake_load)) as engine:
        deadline = time.monotonic() + 60
        while httpx.get(engine.url + "/health", timeout=5).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        deployment = DeploymentConfig(
            name="engine-1", base_url=engine.url + "/v1", model="fake", extra_params="reject"
        )
        settings = gateway_settings(engine.url, models=[ModelConfig(name="engine", deployments=[deployment])])
        with ServerThread(create_app(settings)) as server:
            yield server


def test_responses_plain_and_streamed(gateway: ServerThread) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER_KEY, max_retries=0)
    response = client.responses.create(model="engine", input="abc", max_output_tokens=5, temperature=0)
    assert response.output_text and response.usage.output_tokens == 5
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete" and response.completed_at is None  # as OpenAI's
    events = list(
        client.responses.create(model="engine", input="abc", max_output_tokens=5, temperature=0, stream=True)
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == response.output_text and events[-1].type == "response.incomplete"
    streamed = events[-1].response
    assert streamed.output[0].status == "incomplete" and streamed.output[0].id.endswith("_0")
    assert response.output[0].id.endswith("_0")  # item ids by output position, streamed or not


def test_messages_plain_and_streamed(gateway: ServerThread) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=MASTER_KEY, max_retries=0)
    message = client.messages.create(
        model="engine",
        max_tokens=4,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "abc"}],
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 4
    with client.messages.stream(
        model="engine",
        max_tokens=4,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "abc"}],
    ) as s:
        assert s.get_final_message().content[0].text == message.content[0].text


def test_tools_and_json_the_engine_cannot_honour_are_400s(gateway: ServerThread) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as tools:
        client.responses.create(model="engine", input="abc", tools=[TOOL])
    assert "cannot call tools" in tools.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="engine", messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_object"})  # fmt: skip
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=MASTER_KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as error:
        claude.messages.create(model="engine", max_tokens=4, messages=[{"role": "user", "content": "x"}],
                               tools=[{"name": "f", "input_schema": {"type": "object"}}])  # fmt: skip
    assert error.value.body["error"]["type"] == "invalid_request_error"


def test_count_tokens_equals_the_input_tokens_a_message_reports(gateway: ServerThread) -> None:
    """Anthropic's count_tokens, counted by the engine's /tokenize with the template a request uses."""
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=MASTER_KEY, max_retries=0)
    conversations = [
        {"messages": [{"role": "user", "content": "abc"}]},
        {"system": "Be brief and exact.", "messages": [{"role": "user", "content": "abc def"}]},
        {"system": [{"type": "text", "text": "sys"}], "messages": [
            {"role": "user", "content": [{"type": "text", "text": "first question"}]},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": "and a second one, longer than the first"},
        ]},
    ]  # fmt: skip
    counts = []
    for conversation in conversations:
        counted = claude.messages.count_tokens(model="engine", **conversation)
        sent = claude.messages.create(model="engine", max_tokens=1, **conversation)
        assert counted.input_tokens == sent.usage.input_tokens
        counts.append(counted.input_tokens)
    assert counts[0] < counts[1] < counts[2]


def test_count_tokens_refusals_in_anthropics_shape(gateway: ServerThread) -> None:
    url = gateway.url + "/v1/messages/count_tokens"
    messages = [{"role": "user", "content": "abc"}]
    cases = [
        ({}, {"model": "engine", "messages": messages}, 401, "authentication_error"),
        ({"x-api-key": "sk-wrong"}, {"model": "engine", "messages": messages}, 401, "authentication_error"),
        ({"x-api-key": MASTER_KEY}, {"model": "nope", "messages": messages}, 404, "not_found_error"),
        ({"x-api-key": MASTER_KEY}, {"model": "engine", "messages": messages, "max_tokens": 5}, 400,
         "invalid_request_error"),
        ({"x-api-key": MASTER_KEY}, {"model": "engine"}, 400, "invalid_request_error"),
        ({"x-api-key": MASTER_KEY}, {"model": "engine", "messages": [{"role": "bot", "content": "x"}]}, 400,
         "invalid_request_error"),
    ]  # fmt: skip
    for headers, body, status, kind in cases:
        answer = httpx.post(url, headers=headers, json=body, timeout=30)
        assert (answer.status_code, answer.json()["type"], answer.json()["error"]["type"]) == (
            status, "error", kind), (body, answer.text)  # fmt: skip
    malformed = httpx.post(url, headers={"x-api-key": MASTER_KEY}, content=b"{nope", timeout=30)
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"


def test_a_stop_sequence_that_ends_the_answer_is_reported(gateway: ServerThread) -> None:
    """Anthropic's stop_reason "stop_sequence" and stop_sequence, from the engine's vLLM stop_reason."""
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=MASTER_KEY, max_retries=0)
    ask = {"model": "engine", "max_tokens": 12, "messages": [{"role": "user", "content": "abc"}],
           "extra_body": {"temperature": 0}}  # fmt: skip
    full = claude.messages.create(**ask).content[0].text
    stop = full.strip()[2:4]
    assert len(stop) == 2 and stop in full, full
    cut = claude.messages.create(**ask, stop_sequences=[stop])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert stop not in cut.content[0].text
    with claude.messages.stream(**ask, stop_sequences=[stop]) as streamed:
        final = streamed.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    plain = claude.messages.create(**{**ask, "max_tokens": 2})
    assert (plain.stop_reason, plain.stop_sequence) == ("max_tokens", None)


def test_message_start_carries_the_input_tokens() -> None:
    """As Anthropic's API does (LangChain reads input tokens there): the engine sends usage on every chunk
    when asked (vLLM's continuous_usage_stats), so the first event can say it. A deployment that takes no
    extra parameters is not asked (OpenAI refuses unknown stream options): there it stays 0."""
    with ServerThread(create_engine_app(fake_load)) as engine:
        deadline = time.monotonic() + 60
        while httpx.get(engine.url + "/health", timeout=5).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        models = [ModelConfig(name=name, deployments=[DeploymentConfig(name=f"{name}-1", base_url=engine.url + "/v1",
                  model="fake", extra_params=extras)]) for name, extras in (("open", None), ("strict", "reject"))]  # fmt: skip
        with ServerThread(create_app(gateway_settings(engine.url, models=models))) as server:
            claude = anthropic.Anthropic(base_url=server.url, api_key=MASTER_KEY, max_retries=0)
            for model, sees_input in (("open", True), ("strict", False)):
                ask = {
                    "model": model,
                    "max_tokens": 3,
                    "messages": [{"role": "user", "content": "count me in"}],
                }
                sent = claude.messages.create(**ask, extra_body={"temperature": 0.5}).usage
                expected = sent.input_tokens + sent.cache_read_input_tokens  # the engine's prefix cache
                with claude.messages.stream(**ask, extra_body={"temperature": 0.7}) as stream:
                    events = list(stream)
                    final = stream.get_final_message().usage
                assert events[0].type == "message_start" and expected > 0
                assert final.input_tokens + final.cache_read_input_tokens == expected
                first = events[0].message.usage
                assert first.input_tokens + first.cache_read_input_tokens == (expected if sees_input else 0)
