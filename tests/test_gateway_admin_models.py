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
