"""Prometheus metrics under vLLM's names and labels, so vLLM-aware routers and dashboards work unchanged.

Engine state (queues, KV usage, token and cache counters) is read at scrape time; latencies are observed
as tokens are delivered, per-request histograms (queue, prefill, decode and inference time, token counts,
parameters) when a request finishes, as vLLM's v1 engine observes them. Labels: model_name, as vLLM's before
its `engine` label (0.10); vllm:cache_config_info has vLLM's cache-config labels. Every series is exported
from the start, zero until observed, so dashboards and rate() see it before the first request. Each server
gets its own registry.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.local_engine.engine.async_engine import RequestObserver, RequestTimes

if TYPE_CHECKING:
    from backends.local_engine.engine.llm_engine import LLMEngine

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)  # fmt: skip  (vLLM's for e2e, queue, prefill, decode, inference)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max_value (the context length)."""
    found, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(found)
            found.append(mantissa * scale)
        scale *= 10


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
        tokens = buckets_1_2_5(engine.settings.max_model_len)
        histogram = self._histogram
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS)
        # the name of inter-token latency before vLLM 0.11: the same observations
        self.tpot = histogram("vllm:time_per_output_token_seconds", "Time per output token.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end latency.", E2E_BUCKETS)
        self.queue = histogram(
            "vllm:request_queue_time_seconds", "Time waiting to be scheduled.", E2E_BUCKETS
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds", "Scheduled to first token.", E2E_BUCKETS
        )
        self.decode = histogram("vllm:request_decode_time_seconds", "First to last token.", E2E_BUCKETS)
        self.inference = histogram(
            "vllm:request_inference_time_seconds", "Scheduled to last token.", E2E_BUCKETS
        )
        self.prompt_tokens = histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", tokens)
        self.generation_tokens = histogram(
            "vllm:request_generation_tokens", "Tokens generated per request.", tokens
        )
        self.max_tokens = histogram("vllm:request_params_max_tokens", "The max_tokens parameter.", tokens)
        self.n = histogram("vllm:request_params_n", "The n parameter.", N_BUCKETS)
        self.iteration = histogram(
            "vllm:iteration_tokens_total", "Tokens per engine step.", ITERATION_BUCKETS
        )
        # not vLLM's: how busy the engine loop was, and how much of its step budget it used over time (a step
        # count average of iteration tokens counts prompts whole in the step of their first token)
        self.step_seconds = self._counter(
            "llmgw_engine_step_seconds", "Seconds the engine loop spent in steps."
        )
        self.budget_seconds = self._counter(
            "llmgw_engine_budget_seconds",
            "Step seconds times the share of the step's token budget scheduled: over wall time, how full it ran.",
        )
        self.success = Counter(
            "vllm:request_success",
            "Finished requests.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        for reason in ("stop", "length"):
            self.success.labels(model_name, reason)
        self._cache_config_info(engine)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        family = Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry)
        return family.labels(self.model_name)  # exported from the start, zero until observed

    def _counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, ["model_name"], registry=self.registry).labels(self.model_name)

    def _cache_config_info(self, engine: "LLMEngine") -> None:
        """vLLM's info gauge (1) whose labels are the KV cache's configuration: the pool's blocks go under
        num_gpu_blocks wherever it lives, as vLLM's CPU backend reports them; no swap space (num_cpu_blocks)."""
        blocks, settings = engine.block_manager, engine.settings
        info = {"block_size": str(blocks.block_size), "cache_dtype": settings.kv_cache_dtype,
                "enable_prefix_caching": str(settings.enable_prefix_caching),
                "num_gpu_blocks": str(blocks.num_blocks), "num_cpu_blocks": "None", "engine": "0"}  # fmt: skip
        gauge = Gauge(
            "vllm:cache_config_info", "The KV cache's configuration.", list(info), registry=self.registry
        )
        gauge.labels(**info).set(1)

    def on_tokens(self, times: RequestTimes, now: float, num_new: int) -> None:
        if times.last_token is None:
            self.ttft.observe(now - times.arrival)
            return
        for _ in range(num_new):
            latency = (now - times.last_token) / max(1, num_new)
            self.itl.observe(latency)
            self.tpot.observe(latency)

    def on_step(self, num_tokens: int) -> None:
        self.iteration.observe(num_tokens)

    def on_engine_step(self, scheduled: int, budget: int, seconds: float) -> None:
        self.step_seconds.inc(seconds)
        self.budget_seconds.inc(seconds * min(1.0, scheduled / max(1, budget)))

    def on_request(self, n: int) -> None:
        """One prompt of a request the server accepted, with its n choices (the engine sees each choice alone)."""
        self.n.observe(n)

    def on_finished(self, times: RequestTimes, now: float, reason: str) -> None:
        self.e2e.observe(now - times.arrival)
        if reason == "abort":
            return
        self.success.labels(self.model_name, reason).inc()
        self.prompt_tokens.observe(times.num_prompt_tokens)
        self.generation_tokens.observe(times.num_output_tokens)
        self.max_tokens.observe(times.max_tokens)
        if times.scheduled is not None and times.first_token is not None and times.last_token is not None:
            self.queue.observe(times.scheduled - times.arrival)
            self.prefill.observe(times.first_token - times.scheduled)
            self.decode.observe(times.last_token - times.first_token)
            self.inference.observe(times.last_token - times.scheduled)

    def render(self) -> bytes:
        return generate_latest(self.registry)
