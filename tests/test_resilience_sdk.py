"""Through the real app and the openai SDK: a dead replica is invisible, a mid-stream death is an error."""

from collections.abc import Iterator

import openai
import pytest

from core.models import DeploymentConfig, ModelConfig
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes import FakeUpstream, ServerThread, free_port

KEY = "sk-resilience"


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerThread]:
    with ServerThread(FakeUpstream("live")) as live:
        dead_url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
        deployments = [
            DeploymentConfig(
                name="dead", base_url=dead_url, model="m", connect_timeout_s=1, read_timeout_s=5
            ),
            DeploymentConfig(name="live", base_url=live.url + "/v1", model="m", read_timeout_s=5),
        ]
        settings = Settings(
            master_key=KEY,
            models=[ModelConfig(name="pool", deployments=deployments)],
            cache={"semantic_enabled": False},
        )  # no MiniLM load: routing only
        with ServerThread(create_app(settings)) as server:
            yield server


@pytest.fixture
def client(gateway: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)


def test_dead_replica_is_invisible_to_the_client(client: openai.OpenAI) -> None:
    for i in range(6):
        answer = client.chat.completions.create(model="pool", messages=[{"role": "user", "content": f"q{i}"}])
        assert answer.choices[0].message.content == f"echo: q{i}"
    stream = client.chat.completions.create(
        model="pool", messages=[{"role": "user", "content": "a b"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "echo: a b"


def test_mid_stream_death_raises_in_the_sdk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="pool", messages=[{"role": "user", "content": "die-mid-stream"}], stream=True
    )
    received = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            received.append(chunk)
    assert len(received) == 2  # the chunks sent before the death arrived; then an error, never [DONE]
