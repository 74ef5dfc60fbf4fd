"""Parameters beyond OpenAI's: passed to deployments that accept extras, refused by the others, cache-keyed."""

import io
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from core.context import RequestContext
from core.models import DeploymentConfig, ModelConfig
from gateway.access_log import AccessLog
from gateway.app import create_app
from gateway.metrics import Outcome
from gateway.observability_config import ObservabilitySettings
from tests.conftest import MASTER_KEY, fake_models, gateway_settings
from tests.fakes import FakeUpstream, ServerThread

AUTH = {"authorization": f"Bearer {MASTER_KEY}"}
# vLLM's own, llama.cpp's, and one of OpenAI's newer fields
EXTRAS: dict[str, Any] = {
    "structured_outputs": {"choice": ["yes", "no"]},
    "guided_decoding_backend": "xgrammar",
    "return_tokens_as_token_ids": True,
    "mm_processor_kwargs": {"num_crops": 4},
    "echo": False,
    "cache_prompt": True,
    "typical_p": 0.9,
}


@pytest.fixture(scope="module")
def gateway(upstream: tuple[FakeUpstream, ServerThread]) -> Iterator[ServerThread]:
    url = upstream[1].url + "/v1"
    strict = DeploymentConfig(name="strict-1", base_url=url, model="upstream-model", extra_params="reject")
    models = [*fake_models(upstream[1].url), ModelConfig(name="strict-model", deployments=[strict])]
    with ServerThread(create_app(gateway_settings(upstream[1].url, models=models))) as server:
        yield server


def chat(gateway: ServerThread, model: str, text: str, **fields: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}], **fields}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)


@pytest.mark.parametrize(("name", "value"), EXTRAS.items())
def test_extra_parameter_reaches_a_passthrough_deployment(
    gateway: ServerThread, upstream: tuple[FakeUpstream, ServerThread], name: str, value: Any
) -> None:
    response = chat(gateway, "fake-model", f"extra {name}", **{name: value})
    assert response.status_code == 200, response.text
    assert upstream[0].requests[-1]["body"][name] == value


@pytest.mark.parametrize(("name", "value"), EXTRAS.items())
def test_extra_parameter_is_refused_by_a_reject_deployment(
    gateway: ServerThread, upstream: tuple[FakeUpstream, ServerThread], name: str, value: Any
) -> None:
    before = len(upstream[0].requests)
    response = chat(gateway, "strict-model", "strict", **{name: value})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == name
    assert "Unrecognized request argument" in response.json()["error"]["message"]
    assert len(upstream[0].requests) == before


def test_openai_prompt_cache_retention_is_known_and_checked_nowhere_else(gateway: ServerThread) -> None:
    assert chat(gateway, "strict-model", "x", prompt_cache_retention="24h").status_code == 200


def test_known_fields_stay_strict_on_passthrough_deployments(gateway: ServerThread) -> None:
    response = chat(gateway, "fake-model", "x", temperature=5, cache_prompt=True)
    assert response.status_code == 400 and response.json()["error"]["param"] == "temperature"


def test_extra_parameters_are_part_of_the_exact_cache_key(gateway: ServerThread) -> None:
    def status(**extra: Any) -> str:
        response = chat(gateway, "fake-model", "cache key question", temperature=0, **extra)
        assert response.status_code == 200
        return response.headers["x-cache-status"]

    assert status(typical_p=0.5) == "miss"
    assert status(typical_p=0.5) == "hit"
    assert status(typical_p=0.6) == "miss"
    assert status(typical_p=0.6, mm_processor_kwargs={"a": 1}) == "miss"


def test_default_policy_by_backend() -> None:
    assert DeploymentConfig(name="v", base_url="http://vllm:8000/v1", model="m").accepts_extras()
    assert not DeploymentConfig(name="o", base_url="https://api.openai.com/v1", model="m").accepts_extras()
    assert not DeploymentConfig(name="e", backend="local_engine", model="m").accepts_extras()
    forced = DeploymentConfig(
        name="o", base_url="https://api.openai.com/v1", model="m", extra_params="passthrough"
    )
    assert forced.accepts_extras()


def test_access_log_shows_extras_but_never_sensitive_values() -> None:
    out = io.StringIO()
    logger = logging.getLogger("test.extra_params.access")
    logger.addHandler(logging.StreamHandler(out))
    logger.setLevel(logging.INFO)
    log = AccessLog(ObservabilitySettings(sensitive_params=["mm_processor_kwargs"]), logger)
    body = {"model": "m", "messages": [], "cache_prompt": True, "mm_processor_kwargs": {"secret": "s3cr3t"}}
    ctx = RequestContext("r", "chat", body, {}, "m", extra_params=("cache_prompt", "mm_processor_kwargs"))
    log.write(ctx, Outcome(status=200, e2e_s=0.1, ttft_s=None))
    assert '"cache_prompt":true' in out.getvalue()
    assert "s3cr3t" not in out.getvalue() and '"mm_processor_kwargs":"[redacted]"' in out.getvalue()
