"""Builds the cache from settings: store (in-process or Redis), FAISS index, embedder, stages.

Wiring (gateway/services.py):
    cache = await create_cache(settings.cache, settings.redis_url)
    stages = [..., *cache.stages, ...]      # after rate limits, before routing
    closers.append(cache.aclose)
    admin flush: await cache.service.flush(tenant_id=..., model=...) -> number of entries removed
"""

import asyncio
import importlib.util
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from cache.config import CacheSettings
from cache.embedder import Embedder, SentenceEmbedder, load_sentence_model
from cache.redis_store import RedisStore
from cache.service import CacheService
from cache.stages import ExactCacheStage, SemanticCacheStage
from cache.store import CacheStore, MemoryStore
from gateway.context import Stage

if TYPE_CHECKING:  # FAISS comes with the optional `semantic` extra
    from cache.vector_index import SemanticIndex

log = logging.getLogger("llmgw.cache")


@dataclass
class CacheComponents:
    service: CacheService
    stages: list[Stage]
    redis: Redis | None = field(default=None, repr=False)

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
) -> CacheComponents | None:
    """None when the cache is disabled. `embedder` may be passed in to share one model."""
    if not settings.enabled:
        return None
    redis = _redis(settings, redis_url)
    store: CacheStore = RedisStore(redis, settings.key_prefix) if redis is not None else MemoryStore()
    semantic = settings.semantic_enabled and _semantic_installed()
    if semantic and embedder is None:
        embedder = await load_embedder(settings)
    index = _index(settings, embedder) if semantic else None
    service = CacheService(settings, store, index, embedder if semantic else None)
    await service.start()
    stages: list[Stage] = [ExactCacheStage(service)]
    if service.semantic:
        stages.append(SemanticCacheStage(service))
    return CacheComponents(service, stages, redis)


async def load_embedder(settings: CacheSettings) -> SentenceEmbedder:
    model = await asyncio.to_thread(load_sentence_model, settings.embedding_model, settings.torch_threads)
    return SentenceEmbedder(model, settings.embedding_batch_size)


def _semantic_installed() -> bool:
    missing = [m for m in ("faiss", "sentence_transformers") if importlib.util.find_spec(m) is None]
    if missing:
        log.warning(
            "semantic cache off: %s not installed (pip install 'llmgw[semantic]')", ", ".join(missing)
        )
    return not missing


def _index(settings: CacheSettings, embedder: Embedder | None) -> "SemanticIndex | None":
    import faiss

    from cache.vector_index import SemanticIndex

    if embedder is None:
        return None
    faiss.omp_set_num_threads(1)  # one query at a time is faster single-threaded; keeps cores for serving
    return SemanticIndex(embedder.dim, settings.index, settings.hnsw_m, settings.hnsw_ef_search)


def _redis(settings: CacheSettings, redis_url: str | None) -> Redis | None:
    use_redis = settings.store == "redis" or (settings.store == "auto" and redis_url)
    if not use_redis:
        return None
    if not redis_url:
        raise ValueError("cache.store is 'redis' but redis_url is not set")
    return Redis.from_url(redis_url, decode_responses=False)
