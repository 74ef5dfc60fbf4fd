"""Prometheus metrics under vLLM's names and labels, so vLLM-aware routers and dashboards work unchanged.

Engine state (queues, KV usage, token and cache counters) is read at scrape time; latencies are observed
as tokens are delivered. Each server gets its own registry.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.local_engine.async_engine import RequestObserver, RequestTimes

if TYPE_CHECKING:
    from backends.local_engine.engine import LLMEngine

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class EngineStateCollector(Collector):
    """vLLM's gauges and counters, read from the engine when Prometheus scrapes."""

    def __init__(self, engine: "LLMEngine", model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        scheduler, blocks, counters = self.engine.scheduler, self.engine.block_manager, self.engine.counters
        yield self._gauge(
            "vllm:num_requests_running", "Requests in the running batch.", len(scheduler.running)
        )
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to run.", len(scheduler.waiting))
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent.", blocks.usage)
        yield self._counter("vllm:prefix_cache_queries", "Prompt tokens looked up.", blocks.stats.queries)
        yield self._counter("vllm:prefix_cache_hits", "Prompt tokens served from cache.", blocks.stats.hits)
        yield self._counter("vllm:num_preemptions", "Preemptions.", scheduler.num_preemptions)
        yield self._counter("vllm:prompt_tokens", "Prompt tokens received.", counters.num_prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Tokens generated.", counters.num_generation_tokens)
        yield self._counter(
            "vllm:spec_decode_num_draft_tokens", "Proposed tokens.", counters.num_draft_tokens
        )
        yield self._counter(
            "vllm:spec_decode_num_accepted_tokens", "Accepted proposed tokens.", counters.num_accepted_tokens
        )

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family


class EngineMetrics(RequestObserver):
    def __init__(self, engine: "LLMEngine", model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(EngineStateCollector(engine, model_name))
        labels = ["model_name"]
        self.ttft = self._histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = self._histogram("vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS)
        self.e2e = self._histogram("vllm:e2e_request_latency_seconds", "End-to-end latency.", E2E_BUCKETS)
        self.success = Counter(
            "vllm:request_success", "Finished requests.", [*labels, "finished_reason"], registry=self.registry
        )

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry)

    def on_tokens(self, times: RequestTimes, now: float, num_new: int) -> None:
        if times.last_token is None:
            self.ttft.labels(self.model_name).observe(now - times.arrival)
            return
        for _ in range(num_new):
            self.itl.labels(self.model_name).observe((now - times.last_token) / max(1, num_new))

    def on_finished(self, times: RequestTimes, now: float, reason: str) -> None:
        self.e2e.labels(self.model_name).observe(now - times.arrival)
        if reason != "abort":
            self.success.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
