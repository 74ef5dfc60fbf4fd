"""The observe stage and the metrics it records, driven with fake handlers and a fake clock."""

import io
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from core.context import CacheNote, Principal, Reply, RequestContext, Usage
from core.errors import OpenAIError
from core.models import DeploymentConfig, ModelConfig
from gateway.access_log import AccessLog
from gateway.metrics import GatewayMetrics
from gateway.observability_config import ObservabilitySettings
from gateway.observe import ObserveStage
from gateway.pipeline import chain
from gateway.settings import Settings


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def settings(**observability: Any) -> Settings:
    small = DeploymentConfig(name="d1", base_url="http://x/v1", model="m", input_price_per_1m=1.0,
                             output_price_per_1m=3.0)  # fmt: skip
    result = Settings(models=[ModelConfig(name="alias", deployments=[small])])
    result.__dict__["observability"] = ObservabilitySettings(**observability)  # until the lead nests it
    return result


class Harness:
    def __init__(self, **observability: Any) -> None:
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        self.metrics = GatewayMetrics.from_settings(settings(**observability), self.registry)
        self.log = io.StringIO()
        logger = logging.getLogger(f"test.access.{id(self)}")
        logger.addHandler(logging.StreamHandler(self.log))
        logger.setLevel(logging.INFO)
        access = AccessLog(ObservabilitySettings(**observability), logger)
        self.stage = ObserveStage(self.metrics, access, self.clock)

    async def timer(self, ctx: RequestContext, call_next) -> Reply:
        """What the route stage does for observe: the time spent calling deployments, on ctx.upstream."""
        started = self.clock()
        try:
            return await call_next(ctx)
        finally:
            ctx.upstream.add(self.clock() - started)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def context(self, model: str = "alias", stream: bool = False, tenant: str = "t1") -> RequestContext:
        ctx = RequestContext(
            "r1", "chat", {"messages": []}, {}, model, stream=stream, started_at=self.clock()
        )
        ctx.principal = Principal(tenant_id=tenant, key_id="k", key_prefix="sk-ab")
        return ctx


def upstream(h: Harness, delay: float, reply: Reply, usage: Usage | None = None):
    async def answer(ctx: RequestContext) -> Reply:
        h.clock.now += delay
        ctx.deployment, ctx.usage, ctx.cost_usd = "d1", usage or Usage(10, 5, 2), 0.25
        return reply

    return answer


async def run(h: Harness, ctx: RequestContext, answer, gateway_work: float = 0.0) -> Reply:
    async def before(ctx: RequestContext, call_next) -> Reply:  # e.g. auth, policy, cache lookups
        h.clock.now += gateway_work
        return await call_next(ctx)

    handler = chain([h.stage, before, h.timer, lambda ctx, _next: answer(ctx)])
    return await handler(ctx)


async def test_non_streaming_request_counts_latency_overhead_tokens_and_cost() -> None:
    h = Harness()
    await run(h, h.context(), upstream(h, 0.5, Reply(body={"choices": []})), gateway_work=0.002)
    labels = dict(model="alias", deployment="d1", endpoint="chat", status="200", status_class="2xx",
                  cache_status="bypass", tenant="")  # fmt: skip
    assert h.value("llmgw_requests_total", **labels) == 1
    assert h.value("llmgw_request_duration_seconds_sum", model="alias", deployment="d1",
                   cache_status="bypass", stream="false") == pytest.approx(0.502)  # fmt: skip
    assert h.value("llmgw_gateway_overhead_seconds_sum", model="alias", stream="false") == pytest.approx(
        0.002
    )
    assert h.value("llmgw_gateway_overhead_seconds_bucket", model="alias", stream="false", le="0.001") == 0
    assert h.value("llmgw_gateway_overhead_seconds_bucket", model="alias", stream="false", le="0.0025") == 1
    for kind, count in (("input", 10), ("output", 5), ("cached", 2)):
        assert h.value("llmgw_tokens_total", model="alias", deployment="d1", kind=kind, tenant="") == count
    assert h.value("llmgw_cost_usd_total", model="alias", deployment="d1", tenant="") == 0.25
    assert h.value("llmgw_requests_in_flight", model="alias") == 0


async def chunks(h: Harness, gaps: list[float], texts: list[str]) -> AsyncIterator[dict[str, Any]]:
    for gap, text in zip(gaps, texts, strict=True):
        h.clock.now += gap
        yield {"choices": [{"index": 0, "delta": {"content": text}}]}


async def consume(reply: Reply) -> list[dict[str, Any]]:
    return [chunk async for chunk in reply.stream]


async def test_stream_records_ttft_from_first_token_and_inter_token_gaps() -> None:
    h = Harness()
    ctx = h.context(stream=True)
    # The role chunk (empty content) at +0.1 s is not a token; tokens at +0.3, +0.35, +0.45.
    reply = await run(
        h, ctx, upstream(h, 0.2, Reply(stream=chunks(h, [0.1, 0.2, 0.05, 0.1], ["", "a", "b", "c"])))
    )
    assert h.value("llmgw_requests_in_flight", model="alias") == 1
    assert len(await consume(reply)) == 4
    assert h.value("llmgw_time_to_first_token_seconds_sum", model="alias", deployment="d1") == pytest.approx(
        0.5
    )
    assert h.value("llmgw_inter_token_latency_seconds_count", model="alias", deployment="d1") == 2
    assert h.value("llmgw_inter_token_latency_seconds_sum", model="alias", deployment="d1") == pytest.approx(
        0.15
    )
    # Overhead: first chunk handed over at 0.3 s, of which 0.2 s were spent in the route stage.
    assert h.value("llmgw_gateway_overhead_seconds_sum", model="alias", stream="true") == pytest.approx(0.1)
    assert h.value("llmgw_request_duration_seconds_sum", model="alias", deployment="d1",
                   cache_status="bypass", stream="true") == pytest.approx(0.65)  # fmt: skip
    assert h.value("llmgw_requests_in_flight", model="alias") == 0


def test_a_request_refused_before_the_pipeline_is_counted_and_logged() -> None:
    h = Harness()
    ctx = RequestContext(request_id="r1", endpoint="chat", body={}, headers={}, model="", started_at=99.5)
    h.stage.rejected(ctx, OpenAIError(400, "We could not parse the JSON body of your request."))
    assert h.value("llmgw_requests_total", model="other", deployment="none", endpoint="chat", status="400",
                   status_class="4xx", cache_status="bypass", tenant="") == 1  # fmt: skip
    assert h.value("llmgw_requests_in_flight", model="other") == 0
    line = h.log.getvalue()
    assert '"status":400' in line and "could not parse" in line and '"request_id":"r1"' in line


async def test_errors_of_inner_stages_are_counted_and_re_raised() -> None:
    h = Harness()

    async def refuse(ctx: RequestContext) -> Reply:
        raise OpenAIError(401, "Incorrect API key provided.")

    with pytest.raises(OpenAIError):
        await run(h, h.context(), refuse)
    assert h.value("llmgw_requests_total", model="alias", deployment="none", endpoint="chat", status="401",
                   status_class="4xx", cache_status="bypass", tenant="") == 1  # fmt: skip
    assert h.value("llmgw_gateway_overhead_seconds_count", model="alias", stream="false") == 0
    assert h.value("llmgw_requests_in_flight", model="alias") == 0


async def test_client_leaving_mid_stream_is_counted_as_cancelled_after_inner_stages_settle() -> None:
    h = Harness()
    settled: list[float] = []

    async def inner() -> AsyncIterator[dict[str, Any]]:
        try:
            async for chunk in chunks(h, [0.1, 0.1, 0.1], ["a", "b", "c"]):
                yield chunk
        finally:
            settled.append(h.value("llmgw_requests_total", model="alias", deployment="d1", endpoint="chat",
                                   status="cancelled", status_class="cancelled", cache_status="bypass",
                                   tenant=""))  # fmt: skip

    reply = await run(h, h.context(stream=True), upstream(h, 0.1, Reply(stream=inner())))
    stream = reply.stream
    await anext(stream)
    await stream.aclose()
    assert settled == [0.0]  # the inner stream was closed before the observe stage settled
    assert h.value("llmgw_requests_total", model="alias", deployment="d1", endpoint="chat", status="cancelled",
                   status_class="cancelled", cache_status="bypass", tenant="") == 1  # fmt: skip
    assert h.value("llmgw_requests_in_flight", model="alias") == 0


async def test_error_mid_stream_is_counted_with_its_status() -> None:
    h = Harness()

    async def broken() -> AsyncIterator[dict[str, Any]]:
        yield {"choices": [{"index": 0, "delta": {"content": "a"}}]}
        raise OpenAIError(502, "deployment d1 failed mid-stream")

    reply = await run(h, h.context(stream=True), upstream(h, 0.1, Reply(stream=broken())))
    with pytest.raises(OpenAIError):
        await consume(reply)
    assert h.value("llmgw_requests_total", model="alias", deployment="d1", endpoint="chat", status="502",
                   status_class="5xx", cache_status="bypass", tenant="") == 1  # fmt: skip
    assert h.value("llmgw_gateway_overhead_seconds_count", model="alias", stream="true") == 0


async def test_labels_stay_bounded_unknown_models_and_tenants_beyond_the_cap_become_other() -> None:
    h = Harness(tenant_label=True, max_tenant_labels=1)
    for model, tenant in (("alias", "t1"), ("alias", "t2"), ("prompt-like model name", "t1")):
        await run(h, h.context(model=model, tenant=tenant), upstream(h, 0.01, Reply(body={})))
    assert h.value("llmgw_cost_usd_total", model="alias", deployment="d1", tenant="t1") == 0.25
    assert h.value("llmgw_cost_usd_total", model="alias", deployment="d1", tenant="other") == 0.25
    assert h.value("llmgw_cost_usd_total", model="other", deployment="d1", tenant="t1") == 0.25
    exposition = {s.labels.get("tenant") for m in h.registry.collect() for s in m.samples}
    assert exposition <= {None, "t1", "other"}


async def test_tenant_label_is_empty_by_default() -> None:
    h = Harness()
    await run(h, h.context(tenant="secret-tenant"), upstream(h, 0.01, Reply(body={})))
    assert all(s.labels.get("tenant") in (None, "") for m in h.registry.collect() for s in m.samples)


async def test_cache_hits_record_tokens_and_cost_saved_at_the_alias_price() -> None:
    h = Harness()

    async def cached(ctx: RequestContext) -> Reply:
        ctx.cache_status = "semantic-hit"  # the cache's contract: usage stays zero, savings in ctx.cache
        ctx.cache = CacheNote(
            "semantic-hit", saved_prompt_tokens=1000, saved_completion_tokens=2000, similarity=0.97
        )
        return Reply(body={})

    handler = chain([h.stage, lambda ctx, _next: cached(ctx)])
    await handler(h.context())
    assert h.value("llmgw_cache_saved_tokens_total", model="alias", kind="output") == 2000
    # 1000 input tokens at $1/1M + 2000 output tokens at $3/1M.
    assert h.value("llmgw_saved_usd_total", model="alias", source="cache") == pytest.approx(0.007)
    assert h.value("llmgw_gateway_overhead_seconds_count", model="alias", stream="false") == 0
    assert h.value("llmgw_cache_lookups_total", layer="semantic", result="hit") == 1
    assert h.value("llmgw_cache_lookups_total", layer="exact", result="miss") == 1  # looked there first
    assert h.value("llmgw_cache_similarity_bucket", result="hit", le="0.98") == 1


async def test_a_semantic_lookup_that_finds_nothing_is_a_semantic_miss() -> None:
    """Each layer's lookups are counted, so each layer's hit rate can be read off (outside audit: there
    was never a semantic miss series)."""
    h = Harness()

    async def missed(ctx: RequestContext, semantic: bool) -> Reply:
        ctx.cache_status = "miss"
        ctx.cache = CacheNote("miss") if semantic else None
        return Reply(body={})

    await chain([h.stage, lambda ctx, _next: missed(ctx, True)])(h.context())
    await chain([h.stage, lambda ctx, _next: missed(ctx, False)])(h.context())  # semantic layer off
    assert h.value("llmgw_cache_lookups_total", layer="exact", result="miss") == 2
    assert h.value("llmgw_cache_lookups_total", layer="semantic", result="miss") == 1


async def test_cascades_kept_small_record_the_saving_against_the_alias_price() -> None:
    h = Harness()

    async def small(ctx: RequestContext) -> Reply:
        ctx.cascade, ctx.usage, ctx.cost_usd = "small", Usage(1000, 1000), 0.001
        return Reply(body={})

    await chain([h.stage, lambda ctx, _next: small(ctx)])(h.context())
    assert h.value("llmgw_saved_usd_total", model="alias", source="cascade") == pytest.approx(0.003)


def test_cache_lookups_recorded_by_the_cache_package() -> None:
    h = Harness()
    h.metrics.record_cache_lookup("semantic", True, 0.97)
    h.metrics.record_cache_lookup("exact", False)
    assert h.value("llmgw_cache_lookups_total", layer="semantic", result="hit") == 1
    assert h.value("llmgw_cache_lookups_total", layer="exact", result="miss") == 1
    assert h.value("llmgw_cache_similarity_bucket", result="hit", le="0.98") == 1
    assert h.value("llmgw_cache_similarity_bucket", result="hit", le="0.96") == 0


async def test_metrics_can_be_switched_off() -> None:
    h = Harness(metrics_enabled=False)
    await run(h, h.context(), upstream(h, 0.01, Reply(body={})))
    assert h.value("llmgw_requests_total", model="alias", deployment="d1", endpoint="chat", status="200",
                   status_class="2xx", cache_status="bypass", tenant="") == 0  # fmt: skip
    assert h.log.getvalue().count("\n") == 1  # the access log still writes its line
