"""Background loops: scrape engine replicas' /metrics every second, and run active health checks.

Both tolerate failures: a scrape that fails leaves the old numbers to go stale; a failed health check
opens the replica's breaker, a passing one lets an open breaker probe again.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from routing.replica import EngineLoad, Replica

log = logging.getLogger("llmgw.routing")
WAITING, RUNNING, KV = "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"
HITS, QUERIES = "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"
CACHE_CONFIG = "vllm:cache_config_info"  # labels num_gpu_blocks and block_size: the KV cache's size


def metrics_url(base_url: str) -> str:
    """http://host:8000/v1 → http://host:8000/metrics"""
    root = base_url.rstrip("/").removesuffix("/v1")
    return root + "/metrics"


def parse_engine_metrics(text: str, previous: EngineLoad, now: float) -> EngineLoad:
    totals: dict[str, float] = {}
    kv_tokens: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            totals[name] = totals.get(name, 0.0) + float(sample.value)
            if name == CACHE_CONFIG:
                kv_tokens = (kv_tokens or 0.0) + _kv_tokens(sample.labels)
    load = EngineLoad(
        waiting=totals.get(WAITING, 0.0), running=totals.get(RUNNING, 0.0), kv_usage=totals.get(KV, 0.0),
        hits=totals.get(HITS), queries=totals.get(QUERIES), kv_tokens=kv_tokens or None, at=now,
    )  # fmt: skip
    counters = (load.hits, load.queries, previous.hits, previous.queries)
    if None not in counters and load.queries > previous.queries:
        load.prefix_hit_rate = (load.hits - previous.hits) / (load.queries - previous.queries)
    return load


def _kv_tokens(labels: dict[str, str]) -> float:
    try:
        return float(labels["num_gpu_blocks"]) * float(labels["block_size"])
    except (KeyError, ValueError):  # a label missing or "None" (vLLM before the cache is profiled)
        return 0.0


class Monitor:
    def __init__(
        self,
        replicas: list[Replica],
        scrape_interval_s: float | None,
        health_interval_s: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._replicas = replicas
        self._scrape_interval_s = scrape_interval_s
        self._health_interval_s = health_interval_s
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def set_replicas(self, replicas: list[Replica]) -> None:
        self._replicas = replicas

    def _scraped(self) -> list[Replica]:
        return [r for r in self._replicas if r.engine_pool and base_url(r)]

    async def start(self) -> None:
        if self._scrape_interval_s:
            timeout = aiohttp.ClientTimeout(total=max(self._scrape_interval_s, 0.5))
            self._session = aiohttp.ClientSession(timeout=timeout)
            self._spawn(self._every(self._scrape_interval_s, self._scraped, self.scrape))
        if self._health_interval_s:
            self._spawn(self._every(self._health_interval_s, lambda: self._replicas, self.check_health))

    def _spawn(self, loop: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(loop))

    async def _every(self, interval: float, replicas: Callable[[], list[Replica]], action: Callable) -> None:
        while True:
            await asyncio.gather(*(action(r) for r in replicas()), return_exceptions=True)
            await asyncio.sleep(interval)

    async def scrape(self, replica: Replica) -> None:
        try:
            async with self._session.get(metrics_url(base_url(replica))) as response:
                if response.status != 200:
                    return
                text = await response.text()
            replica.engine = parse_engine_metrics(text, replica.engine, self._clock())
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.debug("scrape of %s failed: %s", replica.name, error)

    async def check_health(self, replica: Replica) -> None:
        try:
            healthy = await replica.backend.health()
        except Exception:  # a broken health probe counts as unhealthy, never as a crash of the loop
            healthy = False
        if healthy:
            replica.breaker.probe_ok()
        elif replica.breaker.state != "open":
            log.warning("deployment %s failed its health check; ejected", replica.name)
            replica.breaker.trip()

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session:
            await self._session.close()


def base_url(replica: Replica) -> str | None:
    return getattr(replica.backend, "base_url", None) or replica.backend.config.base_url
