"""Cascade: keeps confident small answers, escalates weak ones; headers, logprobs and billing right."""

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from core.context import Handler, RequestContext
from core.models import ModelConfig
from gateway.pipeline import chain
from routing.config import CascadePolicy, RoutingSettings
from routing.factory import RoutingServices, create_routing_stages
from routing.learned import ANSWER_FEATURES, AnswerModel, LogisticModel
from tests.routing_fakes import Upstream

SMALL_COST = (10 * 1.0 + 4 * 2.0) / 1e6  # 10 prompt tokens, 4 completion tokens at the fake's prices
LARGE_COST = (10 * 10.0 + 4 * 20.0) / 1e6


class Setup:
    def __init__(self, small: Upstream, large: Upstream, services: RoutingServices, handler: Handler) -> None:
        self.small, self.large, self.services, self.handler = small, large, services, handler


async def build(cascade: dict[str, Any], embedder: Any = None) -> Setup:
    small = await Upstream("small-dep", answer="Paris is the capital").start()
    large = await Upstream("large-dep", answer="Paris , of course").start()
    models = [
        ModelConfig(name="small", deployments=[small.deployment()]),
        ModelConfig(
            name="large", deployments=[large.deployment(input_price_per_1m=10, output_price_per_1m=20)]
        ),
    ]
    routing = RoutingSettings(cascades=[CascadePolicy(alias="auto", small="small", large="large", **cascade)],
                              health_checks=False, scrape_metrics=False)  # fmt: skip
    pools = {
        "small": [await small.backend()],
        "large": [await large.backend(**models[1].deployments[0].model_dump())],
    }
    services = await create_routing_stages(routing, models, pools, embedder=embedder)
    handler = chain([services.cascade_stage, services.route_stage])
    setup = Setup(small, large, services, handler)
    setup.pools = pools  # type: ignore[attr-defined]
    return setup


@pytest.fixture
async def make() -> AsyncIterator[Any]:
    built: list[Setup] = []

    async def factory(**cascade: Any) -> Setup:
        built.append(await build(cascade, cascade.pop("embedder", None)))
        return built[-1]

    yield factory
    for setup in built:
        await setup.services.aclose()
        for backend in [b for pool in setup.pools.values() for b in pool]:  # type: ignore[attr-defined]
            await backend.aclose()
        await setup.small.stop()
        await setup.large.stop()


def request(stream: bool = False, **body: Any) -> RequestContext:
    payload = {"model": "auto", "messages": [{"role": "user", "content": "Capital of France?"}], **body}
    if stream:
        payload |= {"stream": True, "stream_options": {"include_usage": True}}
    return RequestContext(
        request_id="r", endpoint="chat", body=payload, headers={}, model="auto", stream=stream
    )


async def test_confident_small_answer_is_kept(make: Any) -> None:
    s = await make(confidence={"method": "mean_logprob", "threshold": -0.5}, max_small_tokens=64)
    s.small.logprobs = [-0.1, -0.2, -0.1, -0.3]
    ctx = request()
    reply = await s.handler(ctx)
    assert reply.headers == {"x-cascade": "small", "x-served-by": "small-dep"}
    assert ctx.cascade == "small" and ctx.model == "auto"
    assert reply.body["choices"][0]["message"]["content"] == "Paris is the capital"
    assert reply.body["choices"][0]["logprobs"] is None  # asked for by the cascade, not by the client
    sent = s.small.requests[-1]
    assert sent["logprobs"] is True and sent["max_tokens"] == 64
    assert not s.large.requests
    assert ctx.cost_usd == pytest.approx(SMALL_COST)


async def test_weak_small_answer_is_escalated_and_both_are_billed(make: Any) -> None:
    s = await make(confidence={"method": "mean_logprob", "threshold": -0.5})
    s.small.logprobs = [-0.1, -2.5, -1.9, -0.4]
    ctx = request(max_tokens=100)
    reply = await s.handler(ctx)
    assert reply.headers == {"x-cascade": "escalated", "x-served-by": "large-dep"}
    assert reply.body["choices"][0]["message"]["content"] == "Paris , of course"
    assert "logprobs" not in s.large.requests[-1] and s.large.requests[-1]["max_tokens"] == 100
    assert (ctx.usage.prompt_tokens, ctx.usage.completion_tokens) == (20, 8)
    assert ctx.cost_usd == pytest.approx(SMALL_COST + LARGE_COST)
    metrics = s.services.router.metrics
    assert metrics.cascade.labels("auto", "escalated")._value.get() == 1
    assert metrics.cascade_escalation_cost.labels("auto")._value.get() == pytest.approx(SMALL_COST)


async def test_threshold_is_inclusive(make: Any) -> None:
    s = await make(confidence={"method": "mean_logprob", "threshold": -0.5})
    s.small.logprobs = [-0.5, -0.5, -0.5, -0.5]
    assert (await s.handler(request())).headers["x-cascade"] == "small"
    s.small.logprobs = [-0.5, -0.5, -0.5, -0.52]
    assert (await s.handler(request())).headers["x-cascade"] == "escalated"


async def test_min_window_catches_a_weak_stretch_the_mean_hides(make: Any) -> None:
    s = await make(confidence={"method": "min_window", "threshold": -1.0, "window": 2})
    s.small.answer = "a b c d e f g h"
    s.small.logprobs = [-0.01, -0.01, -0.01, -1.6, -1.6, -0.01, -0.01, -0.01]  # mean -0.41
    assert (await s.handler(request())).headers["x-cascade"] == "escalated"
    s.small.logprobs = [-0.01, -0.01, -0.01, -1.6, -0.3, -0.01, -0.01, -0.01]
    assert (await s.handler(request())).headers["x-cascade"] == "small"


async def test_answer_cut_by_max_small_tokens_is_escalated(make: Any) -> None:
    s = await make(confidence={"method": "mean_logprob", "threshold": -5}, max_small_tokens=2)
    reply = await s.handler(request())
    assert reply.headers["x-cascade"] == "escalated"
    assert s.small.requests[-1]["max_tokens"] == 2
    unscored = s.services.router.metrics.cascade_unscored
    assert unscored.labels("auto", "cut_short")._value.get() == 1  # the operator sees the cap decided
    assert unscored.labels("auto", "failed")._value.get() == 0


async def test_clients_own_length_limit_is_not_an_escalation(make: Any) -> None:
    s = await make(confidence={"method": "mean_logprob", "threshold": -5}, max_small_tokens=64)
    reply = await s.handler(request(max_tokens=2))
    assert reply.headers["x-cascade"] == "small" and reply.body["choices"][0]["finish_reason"] == "length"


async def test_small_model_down_escalates(make: Any) -> None:
    s = await make(confidence={"method": "mean_logprob", "threshold": -5})
    s.small.mode = "error_500"
    ctx = request()
    reply = await s.handler(ctx)
    assert reply.headers["x-cascade"] == "escalated" and ctx.cost_usd == pytest.approx(LARGE_COST)
    assert s.services.router.metrics.cascade_unscored.labels("auto", "failed")._value.get() == 1


async def test_client_logprobs_are_kept_when_asked(make: Any) -> None:
    s = await make(confidence={"method": "mean_logprob", "threshold": -5})
    reply = await s.handler(request(logprobs=True))
    assert len(reply.body["choices"][0]["logprobs"]["content"]) == 4


async def test_buffered_stream_sends_the_small_answer_as_chunks(make: Any) -> None:
    s = await make(confidence={"method": "mean_logprob", "threshold": -0.5})
    ctx = request(stream=True)
    reply = await s.handler(ctx)
    chunks = [c async for c in reply.stream]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Paris is the capital" and chunks[-1]["usage"]["completion_tokens"] == 4
    assert reply.headers["x-cascade"] == "small" and s.small.requests[-1]["stream"] is False
    assert all(c["choices"][0].get("logprobs") is None for c in chunks if c["choices"])


async def test_escalated_stream_comes_from_the_large_model_and_sums_usage(make: Any) -> None:
    s = await make(confidence={"method": "mean_logprob", "threshold": -0.5})
    s.small.logprobs = [-3.0] * 4
    ctx = request(stream=True)
    reply = await s.handler(ctx)
    chunks = [c async for c in reply.stream]
    assert chunks[0]["model"] == "large-dep" and reply.headers["x-cascade"] == "escalated"
    assert ctx.usage.completion_tokens == 8
    assert ctx.cost_usd == pytest.approx(SMALL_COST + LARGE_COST)


async def test_prefix_mode_streams_a_confident_small_answer_live(make: Any) -> None:
    s = await make(
        confidence={"method": "mean_logprob", "threshold": -0.5}, stream_mode="prefix", prefix_tokens=2
    )
    ctx = request(stream=True)
    reply = await s.handler(ctx)
    chunks = [c async for c in reply.stream]
    assert s.small.requests[-1]["stream"] is True and reply.headers["x-cascade"] == "small"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == (
        "Paris is the capital"
    )
    assert ctx.cost_usd == pytest.approx(SMALL_COST)


async def test_prefix_mode_escalates_on_a_weak_prefix_and_bills_the_aborted_attempt(make: Any) -> None:
    s = await make(
        confidence={"method": "mean_logprob", "threshold": -0.5}, stream_mode="prefix", prefix_tokens=2
    )
    s.small.logprobs = [-2.0, -2.0, -0.1, -0.1]
    ctx = request(stream=True)
    reply = await s.handler(ctx)
    chunks = [c async for c in reply.stream]
    assert chunks[0]["model"] == "large-dep" and reply.headers["x-cascade"] == "escalated"
    assert ctx.usage.completion_tokens >= 4 + 2 and ctx.usage.prompt_tokens > 10
    assert ctx.cost_usd > LARGE_COST
    wasted = s.services.router.metrics.cascade_escalation_cost.labels("auto")._value.get()
    assert wasted == pytest.approx(ctx.cost_usd - LARGE_COST) and wasted > 0  # the aborted small stream


async def test_tenant_policy_defines_its_own_cascade(make: Any) -> None:
    s = await make(confidence={"method": "mean_logprob", "threshold": -0.5})
    ctx = request()
    ctx.model = ctx.body["model"] = "tenant-auto"
    ctx.policy = type("P", (), {"cascade": {"alias": "tenant-auto", "small": "small", "large": "large",
                                            "confidence": {"method": "mean_logprob", "threshold": 0.5}}})()  # fmt: skip
    reply = await s.handler(ctx)
    assert reply.headers["x-cascade"] == "escalated"  # no logprob reaches +0.5


class KeywordEmbedder:
    """Deterministic 2-d 'embedding' so the learned scorer's arithmetic can be checked exactly."""

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.array([[1.0, 0.0] if "easy" in t else [0.0, 1.0] for t in texts], dtype=np.float32)


async def test_learned_scorer_and_router(make: Any, tmp_path: Any) -> None:
    path = tmp_path / "router.npz"
    LogisticModel(np.array([4.0, -4.0]), 0.0, np.zeros(2), np.ones(2), uses_logprobs=False).save(path)
    s = await make(confidence={"method": "router", "threshold": 0.5, "model_path": str(path)},
                   embedder=KeywordEmbedder())  # fmt: skip
    easy, hard = request(), request()
    easy.body["messages"][0]["content"] = "an easy one"
    hard.body["messages"][0]["content"] = "a hard one"
    assert (await s.handler(easy)).headers["x-cascade"] == "small"
    reply = await s.handler(hard)
    assert reply.headers == {"x-cascade": "routed", "x-served-by": "large-dep"}
    assert len(s.small.requests) == 1  # the router decided before calling the small model


async def test_learned_answer_confidence_reads_the_top2_margin_without_an_embedder(
    make: Any, tmp_path: Any
) -> None:
    path = tmp_path / "confidence.npz"
    weights = np.zeros(len(ANSWER_FEATURES))
    weights[ANSWER_FEATURES.index("first_margin")] = 4.0
    AnswerModel(LogisticModel(weights, -4.0, np.zeros(len(weights)), np.ones(len(weights)), True)).save(path)
    s = await make(confidence={"method": "learned", "threshold": 0.5, "model_path": str(path)})
    s.small.margins = [2.0, 0.1, 0.1, 0.1]  # a clear first (answer) token: P = sigmoid(4) ≈ 0.98
    kept = await s.handler(request())
    assert kept.headers["x-cascade"] == "small"
    assert s.small.requests[-1]["top_logprobs"] == 2 and s.small.requests[-1]["logprobs"] is True
    s.small.margins = [0.2, 3.0, 3.0, 3.0]  # two answers nearly tied on the first token: P ≈ 0.04
    assert (await s.handler(request())).headers["x-cascade"] == "escalated"
    quality = s.services.router.metrics.cascade_quality
    assert quality.labels("auto", "small")._sum.get() == pytest.approx(1 / (1 + np.exp(-4.0)), abs=1e-4)
    assert quality.labels("auto", "escalated")._sum.get() == pytest.approx(1 / (1 + np.exp(3.2)), abs=1e-4)


async def test_escalate_share_sets_the_threshold_from_recent_scores(make: Any) -> None:
    """With escalate_share 0.5 the threshold is the median of the recent scores, whatever their level: an
    answer a fixed threshold of -0.5 would keep is escalated when it is among the weaker half."""
    s = await make(confidence={"method": "mean_logprob", "threshold": -0.5, "escalate_share": 0.5,
                               "share_window": 4, "share_warmup": 4})  # fmt: skip
    outcomes = []
    for level in [-0.1, -0.2, -0.3, -0.4]:  # warm-up: the fixed threshold keeps all four
        s.small.logprobs = [level] * 4
        outcomes.append((await s.handler(request())).headers["x-cascade"])
    assert outcomes == ["small"] * 4
    s.small.logprobs = [-0.35] * 4  # window -0.1..-0.4: the threshold is its median, -0.2
    assert (await s.handler(request())).headers["x-cascade"] == "escalated"
    assert s.services.router.metrics.cascade_threshold.labels("auto")._value.get() == pytest.approx(-0.2)
    s.small.mode = "error_500"  # a failed small attempt enters the window as the lowest score
    assert (await s.handler(request())).headers["x-cascade"] == "escalated"
    s.small.mode = "ok"
    s.small.logprobs = [-0.37] * 4  # window -0.3 -0.4 -0.35 -inf: threshold -0.35, so -0.37 escalates
    assert (await s.handler(request())).headers["x-cascade"] == "escalated"
    s.small.logprobs = [-0.36] * 4  # window -0.4 -0.35 -inf -0.37: threshold -0.37, so -0.36 is kept
    assert (await s.handler(request())).headers["x-cascade"] == "small"


async def test_cached_prompt_tokens_are_billed_at_the_cached_input_price(make: Any) -> None:
    """The large deployment prices cached prompt tokens at 1 USD per 1M instead of 10: 6 of its 10 prompt
    tokens come from the upstream's prefix cache. Without a cached price they cost the input price."""
    s = await make(confidence={"method": "mean_logprob", "threshold": 0.0})  # every answer escalates
    s.large.cached_tokens = 6
    ctx = request()
    await s.handler(ctx)
    assert ctx.cost_usd == pytest.approx(SMALL_COST + LARGE_COST)  # no cached price set: input price
    s.pools["large"][0].config.cached_input_price_per_1m = 1.0  # type: ignore[attr-defined]
    ctx = request()
    await s.handler(ctx)
    assert ctx.usage.cached_tokens == 6
    assert ctx.cost_usd == pytest.approx(SMALL_COST + LARGE_COST - 6 * (10.0 - 1.0) / 1e6)


def test_cost_usd_takes_cached_tokens_from_the_prompt_and_clips_them() -> None:
    from core.models import DeploymentConfig, cost_usd

    priced = DeploymentConfig(name="d", model="m", base_url="http://127.0.0.1:9/v1", input_price_per_1m=2.0,
                              output_price_per_1m=8.0,
                              cached_input_price_per_1m=0.5)  # fmt: skip
    assert cost_usd(priced, 1000, 100, 400) == pytest.approx((600 * 2.0 + 400 * 0.5 + 100 * 8.0) / 1e6)
    assert cost_usd(priced, 1000, 100, 5000) == pytest.approx((1000 * 0.5 + 100 * 8.0) / 1e6)  # at most all
    assert cost_usd(priced, 1000, 100, -3) == cost_usd(priced, 1000, 100)
    plain = priced.model_copy(update={"cached_input_price_per_1m": None})
    assert cost_usd(plain, 1000, 100, 400) == pytest.approx((1000 * 2.0 + 100 * 8.0) / 1e6)


async def test_prefix_mode_with_the_learned_confidence_judges_the_streamed_prefix(
    make: Any, tmp_path: Any
) -> None:
    """The learned answer model reads the held prefix's logprobs and top-2 margins as it reads a whole answer's:
    a clear first token streams live from the small model, a near-tie escalates; both record its estimate."""
    path = tmp_path / "confidence.npz"
    weights = np.zeros(len(ANSWER_FEATURES))
    weights[ANSWER_FEATURES.index("first_margin")] = 4.0
    AnswerModel(LogisticModel(weights, -4.0, np.zeros(len(weights)), np.ones(len(weights)), True)).save(path)
    s = await make(confidence={"method": "learned", "threshold": 0.5, "model_path": str(path)},
                   stream_mode="prefix", prefix_tokens=2)  # fmt: skip
    s.small.margins = [2.0, 0.1, 0.1, 0.1]
    reply = await s.handler(request(stream=True))
    chunks = [c async for c in reply.stream]
    assert reply.headers["x-cascade"] == "small" and s.small.requests[-1]["stream"] is True
    assert s.small.requests[-1]["top_logprobs"] == 2 and chunks[0]["model"] == "small-dep"
    s.small.margins = [0.2, 3.0, 3.0, 3.0]
    reply = await s.handler(request(stream=True))
    assert (
        reply.headers["x-cascade"] == "escalated"
        and [c async for c in reply.stream][0]["model"] == "large-dep"
    )
    quality = s.services.router.metrics.cascade_quality
    assert quality.labels("auto", "small")._sum.get() == pytest.approx(1 / (1 + np.exp(-4.0)), abs=1e-4)
    assert quality.labels("auto", "escalated")._sum.get() == pytest.approx(1 / (1 + np.exp(3.2)), abs=1e-4)
