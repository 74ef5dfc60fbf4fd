"""/v1/responses and /v1/messages in front of our engine's server (the deterministic fake model), and the
engine's 400 for what it cannot honour, carried to each API's clients in their own error shape."""

import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from fake_engine_server import fake_load

from backends.local_engine.server import create_app as create_engine_app
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
    events = list(
        client.responses.create(model="engine", input="abc", max_output_tokens=5, temperature=0, stream=True)
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == response.output_text and events[-1].type == "response.incomplete"


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
