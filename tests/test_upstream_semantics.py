"""Upstream semantics: Retry-After honoured, 4xx passed through intact, 5xx → 502, bounded retries."""

import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from backends.base import UpstreamError
from backends.openai_compat import OpenAICompatBackend, retry_after_s
from core.context import Reply, RequestContext
from gateway.app import create_app
from routing.config import RoutingSettings
from routing.metrics import RoutingMetrics
from routing.retry import RetryBudget, backoff_s
from routing.router import Router
from routing.stage import RouteStage
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import CONTEXT_TOO_LONG as CONTEXT_ERROR
from tests.fakes import FakeUpstream, ServerThread
from tests.routing_fakes import Upstream

AUTH = {"authorization": f"Bearer {MASTER_KEY}"}

RATE_LIMITED = (429, {"error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limit"}},
                {"retry-after": "7"})  # fmt: skip
CONTEXT_TOO_LONG = (
    400,
    {"error": {"message": "This model's maximum context length is 8192 tokens.", "type": "invalid_request_error",
               "param": "messages", "code": "context_length_exceeded"}},
    {},
)  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Fleet:
    """Aliases of fake upstreams behind a RouteStage with a settable clock."""

    def __init__(self) -> None:
        self.upstreams: dict[str, Upstream] = {}
        self.backends: list[OpenAICompatBackend] = []
        self.clock = Clock()

    async def stage(
        self, aliases: dict[str, list[str]], fallbacks: dict[str, list[str]] | None = None, **settings: Any
    ) -> RouteStage:
        pools: dict[str, list[OpenAICompatBackend]] = {}
        for alias, names in aliases.items():
            for name in names:
                if name not in self.upstreams:
                    self.upstreams[name] = await Upstream(name).start()
                backend = await self.upstreams[name].backend()
                self.backends.append(backend)
                pools.setdefault(alias, []).append(backend)
        values = {"backoff_base_s": 0.001, "default_strategy": "weighted_random", **settings}
        router = Router(pools, RoutingSettings(**values), fallbacks or {}, RoutingMetrics(), random.Random(1),
                        clock=self.clock)  # fmt: skip
        return RouteStage(router, random.Random(1))

    async def close(self) -> None:
        for backend in self.backends:
            await backend.aclose()
        for upstream in self.upstreams.values():
            await upstream.stop()


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    f = Fleet()
    yield f
    await f.close()


async def nobody(ctx: RequestContext) -> Reply:
    raise AssertionError("the route stage is the last stage")


def request(alias: str = "m", stream: bool = False) -> RequestContext:
    body = {"model": alias, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return RequestContext(request_id="r1", endpoint="chat", body=body, headers={}, model=alias, stream=stream)


async def test_retry_after_keeps_the_deployment_out_and_another_serves(fleet: Fleet) -> None:
    stage = await fleet.stage({"m": ["busy", "free"]}, max_attempts=3)
    busy = fleet.upstreams["busy"]
    busy.failure = RATE_LIMITED
    for _ in range(8):
        ctx = request()
        await stage(ctx, nobody)
        assert ctx.deployment == "free"
    assert len(busy.requests) == 1  # asked once, then left alone for 7 s
    fleet.clock.now += 6.5
    for _ in range(5):
        await stage(request(), nobody)
    assert len(busy.requests) == 1
    fleet.clock.now += 1.0  # past the 7 s
    busy.failure = None
    served = set()
    for _ in range(20):
        ctx = request()
        await stage(ctx, nobody)
        served.add(ctx.deployment)
    assert served == {"busy", "free"}


async def test_with_every_deployment_waiting_the_client_gets_429_and_retry_after(fleet: Fleet) -> None:
    stage = await fleet.stage({"m": ["only"]}, max_attempts=3)
    only = fleet.upstreams["only"]
    only.failure = RATE_LIMITED
    with pytest.raises(UpstreamError) as caught:
        await stage(request(), nobody)
    assert caught.value.status == 429 and caught.value.headers["retry-after"] == "7"
    assert caught.value.to_dict()["error"]["message"] == "slow down"
    assert len(only.requests) == 1  # not retried within the window
    fleet.clock.now += 3
    with pytest.raises(UpstreamError) as caught:
        await stage(request(stream=True), nobody)
    assert caught.value.status == 429 and caught.value.headers["retry-after"] == "4"
    assert len(only.requests) == 1


async def test_retry_after_sends_the_request_to_a_fallback_alias(fleet: Fleet) -> None:
    stage = await fleet.stage({"m": ["primary"], "backup": ["spare"]}, fallbacks={"m": ["backup"]})
    fleet.upstreams["primary"].failure = RATE_LIMITED
    ctx = request()
    reply = await stage(ctx, nobody)
    assert ctx.deployment == "spare" and reply.body["model"] == "spare"


async def test_503_with_retry_after_reaches_the_client_as_503(fleet: Fleet) -> None:
    stage = await fleet.stage({"m": ["a", "b"]})
    for upstream in fleet.upstreams.values():
        upstream.failure = (503, {"error": {"message": "overloaded"}}, {"retry-after": "2"})
    with pytest.raises(UpstreamError) as caught:
        await stage(request(), nobody)
    assert caught.value.status == 503 and caught.value.headers["retry-after"] == "2"
    assert sum(len(u.requests) for u in fleet.upstreams.values()) == 2


async def test_upstream_4xx_fields_reach_the_client_intact(fleet: Fleet) -> None:
    stage = await fleet.stage({"m": ["a", "b"]})
    for upstream in fleet.upstreams.values():
        upstream.failure = CONTEXT_TOO_LONG
    for stream in (False, True):
        with pytest.raises(UpstreamError) as caught:
            await stage(request(stream=stream), nobody)
        assert caught.value.status == 400
        assert caught.value.to_dict() == CONTEXT_TOO_LONG[1]
    assert sum(len(u.requests) for u in fleet.upstreams.values()) == 2  # never retried


async def test_5xx_after_retries_is_502_with_the_upstream_message(fleet: Fleet) -> None:
    stage = await fleet.stage({"m": ["a", "b"]}, max_attempts=3)
    for upstream in fleet.upstreams.values():
        upstream.failure = (500, {"error": {"message": "CUDA out of memory"}}, {})
    with pytest.raises(UpstreamError) as caught:
        await stage(request(), nobody)
    assert caught.value.status == 502 and "CUDA out of memory" in caught.value.message
    assert sum(len(u.requests) for u in fleet.upstreams.values()) == 3


async def test_retry_budget_caps_the_extra_load_on_a_failing_deployment(fleet: Fleet) -> None:
    stage = await fleet.stage({"m": ["bad"]}, max_attempts=3, retry_budget_ratio=0.1, retry_budget_min_per_s=0,
                              retry_budget_burst=2, failures_to_open=1000)  # fmt: skip
    bad = fleet.upstreams["bad"]
    bad.failure = (500, {"error": {"message": "boom"}}, {})
    for _ in range(20):
        with pytest.raises(UpstreamError):
            await stage(request(), nobody)
    # 20 first attempts; retries at most the burst (2) plus 10 % of 20: not the 40 that 3 attempts allow
    assert 20 < len(bad.requests) <= 24
    assert stage._metrics.retries_denied.labels("m", "bad")._value.get() >= 16


def test_backoff_is_exponential_jittered_and_capped() -> None:
    rng = random.Random(5)
    for attempt in range(1, 12):
        ceiling = min(1.0, 0.05 * 2 ** (attempt - 1))
        samples = [backoff_s(attempt, 0.05, 1.0, rng) for _ in range(200)]
        assert all(0 <= s <= ceiling for s in samples)
        assert max(samples) > ceiling * 0.8  # jittered over the whole range
    assert len({round(backoff_s(3, 0.05, 1.0, rng), 6) for _ in range(50)}) > 40


def test_retry_budget_refills_with_requests_and_time() -> None:
    clock = Clock()
    budget = RetryBudget(ratio=0.5, min_per_s=1.0, burst=2, clock=clock)
    assert budget.withdraw() and budget.withdraw() and not budget.withdraw()
    budget.deposit()
    budget.deposit()
    assert budget.withdraw() and not budget.withdraw()
    clock.now += 1.0
    assert budget.withdraw() and not budget.withdraw()
    clock.now += 100
    assert budget.withdraw() and budget.withdraw() and not budget.withdraw()  # never above the burst


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"retry-after", b"7")], 7.0),
        ([(b"retry-after", b"1.5")], 1.5),
        ([(b"retry-after-ms", b"250"), (b"retry-after", b"9")], 0.25),
        ([(b"retry-after", b"Wed, 21 Oct 2015 07:28:10 GMT")], 10.0),
        ([(b"retry-after", b"soon")], None),
        ([(b"retry-after", b"-3")], None),
        ([], None),
    ],
)
def test_retry_after_header_forms(headers: list[tuple[bytes, bytes]], expected: float | None) -> None:
    now = 1445412480.0  # 07:28:00 GMT that day
    assert retry_after_s(headers, now) == expected


# Through the whole gateway over HTTP: what a client sees.


@pytest.fixture
def gateway() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    fake = FakeUpstream()
    with ServerThread(fake) as upstream, ServerThread(create_app(gateway_settings(upstream.url))) as server:
        yield fake, server


def chat(server: ServerThread, text: str) -> httpx.Response:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def test_client_sees_upstream_429_with_retry_after_and_no_retry(
    gateway: tuple[FakeUpstream, ServerThread],
) -> None:
    fake, server = gateway
    response = chat(server, "fail:429:7")
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    assert response.json()["error"]["message"] == "upstream says 429"
    again = chat(server, "hello")  # within the 7 s: answered without asking the upstream
    assert again.status_code == 429 and 1 <= int(again.headers["retry-after"]) <= 7
    assert len(fake.requests) == 1


def test_client_sees_upstream_4xx_and_5xx_as_documented(gateway: tuple[FakeUpstream, ServerThread]) -> None:
    fake, server = gateway
    response = chat(server, "context-too-long")
    assert response.status_code == 400 and response.json() == {"error": CONTEXT_ERROR}
    response = chat(server, "fail:500")
    assert response.status_code == 502
    assert "upstream says 500" in response.json()["error"]["message"]
