"""Semantic-cache safety without the model: worst-case fakes (every question embeds to the same vector,
a verifier that accepts everything) show that tenants stay apart and bad input skips the lookup; a
missing verifier turns semantic caching off; the online false-hit metric moves on a wrong hit."""

import hashlib
from typing import Any

import numpy as np
import pytest

from cache.config import CachePolicy, CacheSettings
from cache.encoder import EncodedQuestion
from cache.factory import create_cache
from cache.metrics import FALSE_HIT_ESTIMATE, FEEDBACK, SHADOW_CHECKS
from cache.service import CacheService
from cache.shadow import AnswerMatcher, ShadowChecker
from cache.store import MemoryStore
from cache.vector_index import SemanticIndex
from cache.verifier import Verdict
from tests.cache_helpers import Upstream, ctx_for, pipeline

DIM = 8


class SameVectorEmbedder:
    """Every question gets the same vector (similarity 1.0); answers get a vector from their text."""

    dim = DIM

    def __init__(self) -> None:
        self.calls = 0

    async def embed(self, text: str) -> EncodedQuestion:
        self.calls += 1
        vector = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
        return EncodedQuestion(text, vector, ("w",), vector[None, :])

    def encode(self, texts: list[str]) -> np.ndarray:
        rows = [
            np.frombuffer(hashlib.sha256(t.encode()).digest()[:DIM], dtype=np.uint8) - 127.5 for t in texts
        ]
        matrix = np.asarray(rows, dtype=np.float32)
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)

    async def aclose(self) -> None:
        pass


class FixedVerifier:
    def __init__(self, accept: bool) -> None:
        self.accept = accept

    def threshold_for(self, min_precision: float) -> float:
        return 0.5

    def judge_all(self, stored: list[Any], new: Any, threshold: float) -> list[Verdict]:
        return [Verdict(self.accept, 1.0 if self.accept else 0.0) for _ in stored]


class ChangingUpstream(Upstream):
    """A different answer every call, so a served hit is a wrong answer for the new question."""

    TEXTS = ["Paris is the capital of France.", "The Norwegian krone is the currency of Norway."]

    async def __call__(self, ctx):  # type: ignore[no-untyped-def]
        self.text = self.TEXTS[self.calls % len(self.TEXTS)]
        return await super().__call__(ctx)


async def service(
    accept: bool = True, shadow: ShadowChecker | None = None
) -> tuple[CacheService, SameVectorEmbedder]:
    embedder = SameVectorEmbedder()
    settings = CacheSettings(sweep_interval_s=3600, index="flat", defaults=CachePolicy(semantic="static"))
    verifier = FixedVerifier(accept)
    cache = CacheService(settings, MemoryStore(), SemanticIndex(DIM, "flat"), embedder, verifier, shadow)  # type: ignore[arg-type]
    await cache.store.start(cache.index)
    return cache, embedder


async def test_ten_thousand_cross_tenant_tries_give_no_hit():
    cache, _ = await service(accept=True)
    upstream = Upstream()
    handler = pipeline(cache, upstream)
    await handler(ctx_for(tenant="acme"))
    await cache.settle()
    rng = np.random.default_rng(0)
    variants = [
        "ACME",
        "acme ",
        " acme",
        "acme\x00",
        "acme\n",
        "аcme",
        "acme/",
        "acme*",
        "",
        "acm",
        "acmee",
        "Acme",
    ]
    hits = 0
    for i in range(10_000):
        tenant = variants[i % len(variants)] if i < 5000 else f"t{rng.integers(0, 1 << 30)}"
        reply = await handler(ctx_for(tenant=tenant, headers={"cache-control": "no-store"}))
        hits += reply.headers["x-cache-status"] != "miss"
    assert hits == 0 and upstream.calls == 10_001
    same = await handler(ctx_for(tenant="acme", question="What's the capital of France?"))
    assert same.headers["x-cache-status"] == "semantic-hit"  # the fakes do hit within the tenant


@pytest.mark.parametrize(
    "content",
    ["", "   ", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "x" * 100_000],
    ids=["empty", "blank", "image-only", "100k-chars"],
)
async def test_bad_last_turns_skip_the_semantic_lookup_without_error(content):
    cache, embedder = await service(accept=True)
    handler = pipeline(cache, Upstream())
    ctx = ctx_for()
    ctx.body["messages"][-1]["content"] = content
    reply = await handler(ctx)
    await cache.settle()
    assert reply.status == 200 and reply.headers["x-cache-status"] == "miss"
    assert embedder.calls == 0


async def test_a_rejecting_verifier_means_no_semantic_hit():
    cache, _ = await service(accept=False)
    upstream = Upstream()
    handler = pipeline(cache, upstream)
    await handler(ctx_for())
    await cache.settle()
    reply = await handler(ctx_for(question="What's the capital of France?"))
    assert reply.headers["x-cache-status"] == "miss" and upstream.calls == 2


async def test_without_verifier_weights_semantic_caching_is_off(tmp_path, caplog):
    components = await create_cache(CacheSettings(verifier_dir=str(tmp_path)))
    assert components is not None
    try:
        assert not components.service.semantic and len(components.stages) == 1
        assert components.readiness() == {"semantic": False, "reason": "verifier weights unavailable"}
        assert "semantic cache off" in caplog.text
        upstream = Upstream()
        handler = pipeline(components.service, upstream)
        await handler(ctx_for())
        await components.service.settle()
        reply = await handler(ctx_for(question="What's the capital of France?"))
        assert reply.headers["x-cache-status"] == "miss" and upstream.calls == 2
    finally:
        await components.aclose()


async def test_the_online_false_hit_metric_moves_when_a_wrong_hit_is_served():
    embedder = SameVectorEmbedder()
    shadow = ShadowChecker(AnswerMatcher(embedder, "embedding", 0.8), sample_rate=0.5, draw=lambda: 0.0)
    cache, _ = await service(accept=True, shadow=shadow)
    cache.embedder = embedder
    upstream = ChangingUpstream()
    handler = pipeline(cache, upstream)
    before = SHADOW_CHECKS.labels("disagree")._value.get()
    await handler(ctx_for(question="What is the capital of France?"))
    await cache.settle()
    reply = await handler(ctx_for(question="What currency is used in Norway?"))  # wrong on purpose
    assert reply.headers["x-cache-status"] == "semantic-hit"
    await cache.settle()
    assert upstream.calls == 2  # the shadow call
    assert SHADOW_CHECKS.labels("disagree")._value.get() == before + 1
    assert FALSE_HIT_ESTIMATE._value.get() > 0


async def test_feedback_header_evicts_and_counts():
    cache, _ = await service(accept=True)
    upstream = Upstream()
    handler = pipeline(cache, upstream)
    await handler(ctx_for())
    await cache.settle()
    before = FEEDBACK.labels("header")._value.get()
    reply = await handler(ctx_for(question="Which city?", headers={"x-cache-feedback": "wrong"}))
    await cache.settle()
    assert reply.headers["x-cache-status"] == "miss" and upstream.calls == 2
    assert FEEDBACK.labels("header")._value.get() == before + 1
    assert len(cache.index) == 1  # only the fresh answer is left
