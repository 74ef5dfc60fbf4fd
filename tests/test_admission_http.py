"""Admission through the HTTP API: a saturated pool refuses with 429 + Retry-After in OpenAI's shape, the
service class reaches the upstream as vLLM's `priority`, the queue's series are exported."""

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from core.models import DeploymentConfig, ModelConfig
from gateway.app import create_app
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import FakeUpstream, ServerThread

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


@pytest.fixture(scope="module")
def saturated() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    """One deployment that runs one request at a time; the default class waits at most 0.5 s."""
    fake = FakeUpstream()
    with ServerThread(fake) as upstream:
        deployment = DeploymentConfig(name="one-slot", base_url=upstream.url + "/v1", model="m",
                                      max_concurrency=1, send_priority=True, read_timeout_s=10)  # fmt: skip
        admission = {"classes": {"standard": {"rank": 1, "ttft_s": 1, "itl_s": 0.2, "queue_deadline_s": 0.5,
                                              "pool_share": 1.0},
                                 "batch": {"rank": 2, "ttft_s": 1, "itl_s": 1, "queue_deadline_s": 5,
                                           "pool_share": 1.0}}}  # fmt: skip
        settings = gateway_settings(
            upstream.url, models=[ModelConfig(name="slow", deployments=[deployment])],
            routing={"admission": admission, "scrape_metrics": False},
        )  # fmt: skip
        with ServerThread(create_app(settings)) as gateway:
            yield fake, gateway


def chat(text: str) -> dict:
    return {"model": "slow", "messages": [{"role": "user", "content": text}], "max_tokens": 8}


async def test_a_request_that_cannot_start_in_time_gets_429_with_retry_after(
    saturated: tuple[FakeUpstream, ServerThread],
) -> None:
    fake, gateway = saturated
    async with httpx.AsyncClient(base_url=gateway.url, headers=AUTH, timeout=30) as client:
        holder = asyncio.create_task(client.post("/v1/chat/completions", json=chat("sleep:2")))
        await asyncio.sleep(0.3)
        started = time.perf_counter()
        refused = await client.post("/v1/chat/completions", json=chat("hello"))
        waited = time.perf_counter() - started
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "pool_saturated" and "saturated" in error["message"]
        assert waited < 1.5  # refused by its deadline (0.5 s), not left to time out
        assert (await holder).status_code == 200
        ok = await client.post("/v1/chat/completions", json=chat("after"))  # the slot was given back
        assert ok.status_code == 200
    assert fake.requests[-1]["body"]["priority"] == 1  # the standard class's rank, as vLLM's priority


async def test_a_queued_stream_starts_when_the_slot_frees_and_keeps_its_usage(
    saturated: tuple[FakeUpstream, ServerThread],
) -> None:
    _, gateway = saturated
    async with httpx.AsyncClient(base_url=gateway.url, headers=AUTH, timeout=30) as client:
        holder = asyncio.create_task(client.post("/v1/chat/completions", json=chat("sleep:0.3")))
        await asyncio.sleep(0.1)
        body = {**chat("one two three"), "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and '"usage"' in lines[-2]
        assert (await holder).status_code == 200
        metrics = (await client.get("/metrics")).text
    assert 'llmgw_admission_wait_seconds_count{class="standard",model="slow"}' in metrics
    assert (
        'llmgw_admission_shed_total{class="standard",model="slow",reason="expired",tenant="master"}'
        in metrics
    )
    assert (
        'llmgw_admission_slo_requests_total{class="standard",model="slow",outcome="met",tenant="master"}'
        in metrics
    )
    assert 'llmgw_admission_pool_slots{model="slow"} 1.0' in metrics
