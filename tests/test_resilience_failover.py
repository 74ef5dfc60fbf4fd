"""Deployments killed before connect, after headers, mid-stream; stalls; retries and fallback order."""

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from backends.base import UpstreamError
from core.context import Reply, RequestContext
from routing.config import RoutingPolicy, RoutingSettings
from routing.metrics import RoutingMetrics
from routing.router import Router
from routing.stage import RouteStage
from tests.routing_fakes import Upstream


async def nobody(ctx: RequestContext) -> Reply:
    raise AssertionError("the route stage is the last stage")


class Cluster:
    """Upstreams grouped into aliases, and a RouteStage in front of them."""

    def __init__(self) -> None:
        self.upstreams: dict[str, Upstream] = {}
        self.backends: list[Any] = []

    async def build(
        self, aliases: dict[str, list[str]], fallbacks: dict[str, list[str]] | None = None, **settings: Any
    ) -> tuple[RouteStage, Router]:
        pools = {}
        for alias, names in aliases.items():
            pools[alias] = []
            for name in names:
                upstream = self.upstreams.get(name) or await Upstream(name).start()
                self.upstreams[name] = upstream
                backend = await upstream.backend(read_timeout_s=settings.pop("read_timeout_s", 2.0))
                self.backends.append(backend)
                pools[alias].append(backend)
        values = {"backoff_base_s": 0.001, "default_strategy": "weighted_random", **settings}
        router = Router(pools, RoutingSettings(**values), fallbacks or {}, RoutingMetrics(), random.Random(3))
        return RouteStage(router, random.Random(3)), router

    async def close(self) -> None:
        for backend in self.backends:
            await backend.aclose()
        for upstream in self.upstreams.values():
            await upstream.stop()


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    yield c
    await c.close()


def request(alias: str = "m", stream: bool = False, policy: Any = None) -> RequestContext:
    body = {"model": alias, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return RequestContext(request_id="r1", endpoint="chat", body=body, headers={}, model=alias, stream=stream,
                          policy=policy)  # fmt: skip


async def collect(reply: Reply) -> list[dict[str, Any]]:
    return [chunk async for chunk in reply.stream]


def breaker_state(router: Router, name: str) -> str:
    return next(r for r in router.all_replicas() if r.name == name).breaker.state


async def test_dead_before_connect_falls_over_to_a_live_replica(cluster: Cluster) -> None:
    stage, router = await cluster.build({"m": ["dead", "live"]}, failures_to_open=2)
    await cluster.upstreams["dead"].stop()
    for _ in range(6):
        ctx = request()
        reply = await stage(ctx, nobody)
        assert reply.body["model"] == "live" and ctx.deployment == "live"
    assert breaker_state(router, "dead") == "open"
    assert router.metrics.retries.labels("m", "live")._value.get() >= 1


async def test_headers_then_death_before_first_chunk_is_retried(cluster: Cluster) -> None:
    stage, router = await cluster.build({"m": ["flaky", "good"]}, max_attempts=2)
    cluster.upstreams["flaky"].mode = "headers_then_die"
    for _ in range(4):
        chunks = await collect(await stage(request(stream=True), nobody))
        assert chunks[0]["model"] == "good"
    assert all(r.outstanding == 0 for r in router.all_replicas())


async def test_mid_stream_death_raises_after_the_sent_chunks(cluster: Cluster) -> None:
    stage, router = await cluster.build({"m": ["dying"]})
    cluster.upstreams["dying"].answer = "one two three four"
    cluster.upstreams["dying"].mode = "die_mid_stream"
    reply = await stage(request(stream=True), nobody)
    received = []
    with pytest.raises(UpstreamError) as caught:
        async for chunk in reply.stream:
            received.append(chunk)
    assert len(received) == 2 and caught.value.status >= 500
    assert router.metrics.failures.labels("dying", "mid_stream")._value.get() == 1
    assert router.all_replicas()[0].outstanding == 0


async def test_stalled_stream_hits_the_read_timeout(cluster: Cluster) -> None:
    stage, _ = await cluster.build({"m": ["staller"]}, read_timeout_s=0.4)
    cluster.upstreams["staller"].answer = "one two three four"
    cluster.upstreams["staller"].mode = "stall_mid_stream"
    reply = await stage(request(stream=True), nobody)
    with pytest.raises(UpstreamError) as caught:
        await asyncio.wait_for(collect(reply), timeout=5)
    assert caught.value.status == 504


async def test_first_byte_timeout_moves_on_to_the_next_replica(cluster: Cluster) -> None:
    stage, _ = await cluster.build({"m": ["slow", "quick"]}, first_byte_timeout_s=0.3, max_attempts=2)
    cluster.upstreams["slow"].mode = "stall_before_first"
    started = asyncio.get_running_loop().time()
    for _ in range(3):
        chunks = await collect(await stage(request(stream=True), nobody))
        assert chunks[0]["model"] == "quick"
    assert asyncio.get_running_loop().time() - started < 3


async def test_client_errors_are_not_retried(cluster: Cluster) -> None:
    stage, router = await cluster.build({"m": ["picky", "other"]})
    for upstream in cluster.upstreams.values():
        upstream.mode = "error_400"
    with pytest.raises(UpstreamError) as caught:
        await stage(request(), nobody)
    assert caught.value.status == 400
    assert sum(len(u.requests) for u in cluster.upstreams.values()) == 1
    assert {r.breaker.state for r in router.all_replicas()} == {"closed"}


async def test_fallback_aliases_in_config_then_policy_order(cluster: Cluster) -> None:
    aliases = {"main": ["m1", "m2"], "first": ["f1"], "second": ["s1"], "tenant": ["t1"]}
    stage, router = await cluster.build(aliases, fallbacks={"main": ["first", "second"]}, max_attempts=2)
    for name in ("m1", "m2", "f1", "s1"):
        cluster.upstreams[name].mode = "error_500"
    policy = type("P", (), {"routing": {"fallbacks": {"main": ["tenant"]}}})()
    ctx = request("main", policy=policy)
    reply = await stage(ctx, nobody)
    assert reply.body["model"] == "t1" and ctx.deployment == "t1"
    tried = [n for n in ("m1", "m2", "f1", "s1", "t1") if cluster.upstreams[n].requests]
    assert tried == ["m1", "m2", "f1", "s1", "t1"]
    assert router.metrics.fallbacks.labels("main", "second")._value.get() == 1
    assert router.metrics.fallbacks.labels("main", "tenant")._value.get() == 1


async def test_everything_down_gives_a_5xx(cluster: Cluster) -> None:
    stage, _ = await cluster.build({"m": ["a", "b"]})
    for upstream in cluster.upstreams.values():
        await upstream.stop()
    with pytest.raises(UpstreamError) as caught:
        await stage(request(), nobody)
    assert caught.value.status == 503


async def test_policy_max_attempts_limits_tries(cluster: Cluster) -> None:
    stage, _ = await cluster.build({"m": ["only"]}, max_attempts=3)
    cluster.upstreams["only"].mode = "error_500"
    with pytest.raises(UpstreamError):
        await stage(request(policy=type("P", (), {"routing": RoutingPolicy(max_attempts=2)})()), nobody)
    assert len(cluster.upstreams["only"].requests) == 2


async def test_outstanding_gauge_counts_the_calls_in_flight(cluster: Cluster) -> None:
    stage, router = await cluster.build({"m": ["a"]})

    def outstanding() -> float | None:
        labels = {"deployment": "a"}
        return router.metrics.registry.get_sample_value("llmgw_deployment_outstanding_requests", labels)

    await stage(request(), nobody)
    assert outstanding() == 0
    streaming = await stage(request(stream=True), nobody)
    assert outstanding() == 1  # until the stream ends
    await collect(streaming)
    assert outstanding() == 0
    cluster.upstreams["a"].mode = "error_400"
    with pytest.raises(UpstreamError):
        await stage(request(), nobody)
    assert outstanding() == 0


async def test_prompt_blocks_wait_as_pending_prefill_until_the_first_byte(cluster: Cluster) -> None:
    """engine_score's prefill term reads them: an attempt's uncached prompt blocks count on its replica from
    dispatch to the first byte (or the attempt's end)."""
    stage, router = await cluster.build({"m": ["a"]}, default_strategy="engine_score", prefix_block_chars=8,
                                        first_byte_timeout_s=0.3, max_attempts=1)  # fmt: skip
    (replica,) = router.all_replicas()
    cluster.upstreams["a"].mode = "stall_before_first"
    call = asyncio.create_task(stage(request(stream=True), nobody))
    await asyncio.sleep(0.1)
    assert replica.prefill_ahead(None) > 0 and replica.outstanding == 1  # sent, nothing back yet
    with pytest.raises(UpstreamError):
        await call  # no first byte in time
    assert replica.pending_prefill == {} and replica.outstanding == 0
    cluster.upstreams["a"].mode = "ok"
    streaming = await stage(request(stream=True), nobody)
    assert (
        replica.pending_prefill == {} and replica.outstanding == 1
    )  # first byte in: prefilled, still answering
    await collect(streaming)
    await stage(request(), nobody)
    assert replica.pending_prefill == {} and replica.outstanding == 0
