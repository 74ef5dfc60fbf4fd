"""/v1/responses to a deployment with `responses_api: true`: sent to the upstream's own /responses,
still through the chat pipeline (the answer is translated back and forth at the backend)."""

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from core.models import DeploymentConfig, ModelConfig
from gateway.app import create_app
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import FakeUpstream, ServerThread

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


@pytest.fixture(scope="module")
def client(upstream: tuple[FakeUpstream, ServerThread]) -> Iterator[openai.OpenAI]:
    native = DeploymentConfig(name="vllm-1", base_url=upstream[1].url + "/v1", model="upstream-model",
                              responses_api=True)  # fmt: skip
    settings = gateway_settings(
        upstream[1].url, models=[ModelConfig(name="native-model", deployments=[native])]
    )
    with ServerThread(create_app(settings)) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key=MASTER_KEY, max_retries=0)


def last(upstream: tuple[FakeUpstream, ServerThread]) -> dict[str, Any]:
    return upstream[0].requests[-1]


def test_create_goes_to_the_upstream_responses_api(client: openai.OpenAI, upstream: tuple) -> None:
    response = client.responses.create(model="native-model", input="hi", instructions="Be kind.")
    assert response.output_text == "native: hi"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (11, 2)
    sent = last(upstream)
    assert sent["path"] == "/v1/responses"
    assert sent["body"]["instructions"] == "Be kind." and sent["body"]["model"] == "upstream-model"
    assert sent["body"]["input"] == [{"type": "message", "role": "user", "content": "hi"}]


def test_stream_from_the_upstream_responses_api(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="native-model", input="hi there", stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "native: hi there"
    assert events[-1].type == "response.completed" and events[-1].response.usage.output_tokens == 2


def test_tools_round_trip_through_the_upstream(client: openai.OpenAI, upstream: tuple) -> None:
    first = client.responses.create(model="native-model", input="use-tool", tools=[WEATHER])
    [call] = first.output
    assert (call.type, call.name, call.arguments) == ("function_call", "get_weather", '{"city": "Oslo"}')
    assert last(upstream)["body"]["tools"] == [WEATHER]
    second = client.responses.create(
        model="native-model", previous_response_id=first.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "cold"}],
    )  # fmt: skip
    assert second.output_text == "native: cold"
    assert last(upstream)["body"]["input"][1:] == [
        {
            "type": "function_call",
            "call_id": "call_up_1",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_up_1", "output": "cold"},
    ]


def test_streamed_tool_call_from_the_upstream(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(model="native-model", input="use-tool", tools=[WEATHER], stream=True)
    )
    assert events[-1].response.output[0].arguments == '{"city": "Oslo"}'


def test_chat_completions_still_use_chat(client: openai.OpenAI, upstream: tuple) -> None:
    client.chat.completions.create(model="native-model", messages=[{"role": "user", "content": "x"}])
    assert last(upstream)["path"] == "/v1/chat/completions"
