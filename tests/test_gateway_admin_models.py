"""Model aliases created through the admin API are served at once; cascades work through the app."""

import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from gateway.app import create_app
from routing.config import CascadePolicy, RoutingSettings
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import FakeUpstream, ServerThread

ADMIN = {"authorization": "Bearer admin-secret"}


@pytest.fixture(scope="module")
def gateway(upstream: tuple[FakeUpstream, ServerThread]) -> Iterator[ServerThread]:
    # "sure" keeps the small answer, "unsure" always escalates.
    sure = CascadePolicy(alias="sure", small="fake-model", large="fake-model", confidence={"threshold": -1e9})
    unsure = CascadePolicy(
        alias="unsure", small="fake-model", large="fake-model", confidence={"threshold": 1e9}
    )
    settings = gateway_settings(
        upstream[1].url, admin_token="admin-secret", routing=RoutingSettings(cascades=[sure, unsure])
    )
    with ServerThread(create_app(settings)) as server:
        yield server


def client(gateway: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER_KEY, max_retries=0)


def test_alias_created_through_the_admin_api_is_routed(gateway: ServerThread, upstream: tuple) -> None:
    deployment = {"name": "db-dep", "base_url": upstream[1].url + "/v1", "model": "from-db",
                  "output_price_per_1m": 5.0}  # fmt: skip
    response = httpx.put(
        f"{gateway.url}/admin/v1/models/db-alias", json={"name": "db-alias", "deployments": [deployment]},
        headers=ADMIN, timeout=10,
    )  # fmt: skip
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 5
    while "db-alias" not in [m.id for m in client(gateway).models.list().data]:
        assert time.monotonic() < deadline, "the new alias never appeared"
        time.sleep(0.05)
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="db-alias", messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["x-served-by"] == "db-dep"
    assert upstream[0].requests[-1]["body"]["model"] == "from-db"


def test_cascade_keeps_the_small_answer_above_threshold(gateway: ServerThread) -> None:
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="sure", messages=[{"role": "user", "content": "hello"}]
    )
    assert raw.headers["x-cascade"] == "small" and raw.parse().choices[0].message.content == "echo: hello"


def test_cascade_escalates_below_threshold_and_bills_both_attempts(
    gateway: ServerThread, upstream: tuple
) -> None:
    before = len(upstream[0].requests)
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="unsure", messages=[{"role": "user", "content": "hello"}]
    )
    assert raw.headers["x-cascade"] == "escalated"
    assert len(upstream[0].requests) == before + 2
    assert upstream[0].requests[-2]["body"].get("logprobs") is True


def test_an_alias_cannot_take_over_another_aliases_deployment(gateway: ServerThread, upstream: tuple) -> None:
    """A deployment name is one backend: reusing fake-model's "fake-1" with another URL would reroute
    fake-model for every tenant. Refused (409); the same configuration may be shared."""
    taken = {"name": "fake-1", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    answer = httpx.put(f"{gateway.url}/admin/v1/models/thief", json={"name": "thief", "deployments": [taken]},
                       headers=ADMIN, timeout=10)  # fmt: skip
    assert answer.status_code == 409 and "fake-1" in answer.json()["error"]["message"], answer.text
    assert "thief" not in [
        m["name"] for m in httpx.get(f"{gateway.url}/admin/v1/models", headers=ADMIN).json()
    ]
    assert client(gateway).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "x"}]
    )
    listed = httpx.get(f"{gateway.url}/admin/v1/models", headers=ADMIN, timeout=10).json()
    shared = next(m["config"] for m in listed if m["name"] == "fake-model")["deployments"]
    answer = httpx.put(f"{gateway.url}/admin/v1/models/twin", json={"name": "twin", "deployments": shared},
                       headers=ADMIN, timeout=10)  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert httpx.delete(f"{gateway.url}/admin/v1/models/twin", headers=ADMIN, timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"input_price_per_1m": -1.0}, "input_price_per_1m"),
        ({"output_price_per_1m": -0.5}, "output_price_per_1m"),
        ({"base_url": "not a url"}, "base_url"),
        ({"base_url": "ftp://host/v1"}, "base_url"),
        ({"api_key_env": "LLMGW_ADMIN_TOKEN"}, "api_key_env"),
        ({"weight": 0}, "weight"),
        ({"read_timeout_s": -1}, "read_timeout_s"),
        ({"input_price_per_1M": 1.0}, "input_price_per_1M"),
    ],
)
def test_a_deployment_that_cannot_be_served_is_a_422(
    gateway: ServerThread, upstream: tuple, change: dict, field: str
) -> None:
    deployment = {"name": "bad-dep", "base_url": upstream[1].url + "/v1", "model": "m", **change}
    answer = httpx.put(f"{gateway.url}/admin/v1/models/bad", json={"name": "bad", "deployments": [deployment]},
                       headers=ADMIN, timeout=10)  # fmt: skip
    assert answer.status_code == 422 and field in answer.text, answer.text


def test_an_alias_without_deployments_or_falling_back_on_itself_is_a_422(gateway: ServerThread) -> None:
    for body in ({"name": "bad", "deployments": []},
                 {"name": "bad", "fallbacks": ["bad"], "deployments": [{"name": "d", "base_url": "http://h/v1",
                                                                       "model": "m"}]}):  # fmt: skip
        answer = httpx.put(f"{gateway.url}/admin/v1/models/bad", json=body, headers=ADMIN, timeout=10)
        assert answer.status_code == 422, answer.text
