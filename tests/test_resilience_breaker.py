"""Circuit breaker: opens after consecutive failures, probes half-open, recovers; health checks eject."""

import asyncio

import pytest

from backends.base import UpstreamError
from routing.breaker import CircuitBreaker
from routing.metrics import BREAKER_STATES, RoutingMetrics
from routing.monitor import Monitor
from tests.test_resilience_failover import Cluster, collect, nobody, request


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_half_opens_and_closes() -> None:
    clock, states = Clock(), []
    breaker = CircuitBreaker(3, cooldown_s=10, half_open_probes=1, clock=clock, on_change=states.append)
    for _ in range(2):
        breaker.on_failure()
    breaker.on_success()  # a success resets the run of failures
    for _ in range(3):
        breaker.on_failure()
    assert breaker.state == "open" and not breaker.available()
    clock.now = 10
    assert breaker.available() and breaker.state == "half_open"
    breaker.on_dispatch()
    assert not breaker.available()  # one probe at a time
    breaker.on_failure()
    assert breaker.state == "open"  # a failed probe re-opens at once
    clock.now = 20
    breaker.on_dispatch()
    breaker.on_success()
    assert breaker.state == "closed" and states == ["open", "half_open", "open", "half_open", "closed"]


async def test_breaker_ejects_then_recovers_through_the_stage() -> None:
    cluster = Cluster()
    try:
        stage, router = await cluster.build(
            {"m": ["sick", "well"]}, failures_to_open=2, open_cooldown_s=0.3, max_attempts=2
        )
        sick = cluster.upstreams["sick"]
        sick.mode = "error_500"
        for _ in range(8):
            await stage(request(), nobody)
        assert len(sick.requests) == 2  # ejected after two failures, then left alone
        gauge = router.metrics.breaker_state.labels("sick")._value.get()
        assert gauge == BREAKER_STATES["open"]
        sick.mode = "ok"
        await asyncio.sleep(0.35)
        for _ in range(12):
            await stage(request(), nobody)
        assert len(sick.requests) > 3  # probed, closed, and serving again
        assert router.metrics.breaker_state.labels("sick")._value.get() == BREAKER_STATES["closed"]
    finally:
        await cluster.close()


async def test_mid_stream_failures_count_towards_the_breaker() -> None:
    cluster = Cluster()
    try:
        stage, router = await cluster.build({"m": ["dying"]}, failures_to_open=2, open_cooldown_s=60)
        cluster.upstreams["dying"].answer = "one two three four"
        cluster.upstreams["dying"].mode = "die_mid_stream"
        for _ in range(2):
            with pytest.raises(UpstreamError):
                await collect(await stage(request(stream=True), nobody))
        assert router.all_replicas()[0].breaker.state == "open"
    finally:
        await cluster.close()


async def test_active_health_checks_eject_and_readmit() -> None:
    cluster = Cluster()
    try:
        _, router = await cluster.build({"m": ["a", "b"]})
        monitor = Monitor(router.all_replicas(), scrape_interval_s=None, health_interval_s=0.05)
        cluster.upstreams["a"].mode = "error_500"  # /v1/models answers 500
        await monitor.start()
        await asyncio.sleep(0.3)
        states = {r.name: r.breaker.state for r in router.all_replicas()}
        assert states == {"a": "open", "b": "closed"}
        cluster.upstreams["a"].mode = "ok"
        await asyncio.sleep(0.3)
        assert router.all_replicas()[0].breaker.state == "half_open"
        await monitor.aclose()
    finally:
        await cluster.close()


async def test_engine_metrics_are_scraped_in_the_background() -> None:
    cluster = Cluster()
    try:
        _, router = await cluster.build({"m": ["engine"]}, engine_pools=["m"])
        cluster.upstreams["engine"].metrics_text = (
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 7\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.8\n"
        )
        monitor = Monitor(router.all_replicas(), scrape_interval_s=0.05, health_interval_s=None)
        await monitor.start()
        await asyncio.sleep(0.3)
        replica = router.all_replicas()[0]
        assert (replica.engine.waiting, replica.engine.kv_usage) == (7, 0.8)
        await cluster.upstreams["engine"].stop()  # failing scrapes keep the loop alive
        await asyncio.sleep(0.2)
        assert not monitor._tasks[0].done()
        await monitor.aclose()
    finally:
        await cluster.close()


def test_metrics_use_their_own_registry() -> None:
    first, second = RoutingMetrics(), RoutingMetrics()  # no duplicate-series error
    first.set_breaker("x", "open")
    assert second.breaker_state.labels("x")._value.get() == 0
