"""The cache service: finds answers (exact key, or a guarded nearest neighbour), serves them, and
stores new answers once they are known to be complete. Failures of the cache never fail a request."""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cache.answers import StreamCollector, is_storable
from cache.config import CacheSettings
from cache.embedder import Embedder
from cache.entry import CacheEntry
from cache.guard import conflict, parse
from cache.replay import replay_body, replay_stream
from cache.request import CacheRequest
from cache.store import CacheStore
from gateway.context import Reply, RequestContext, Usage

if TYPE_CHECKING:  # FAISS comes with the optional `semantic` extra
    from cache.vector_index import SemanticIndex

log = logging.getLogger("llmgw.cache")


@dataclass(frozen=True)
class SemanticMatch:
    entry: CacheEntry
    similarity: float


class CacheService:
    def __init__(
        self,
        settings: CacheSettings,
        store: CacheStore,
        index: "SemanticIndex | None" = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.index = index
        self.embedder = embedder
        self._sweeper: asyncio.Task[None] | None = None
        self._pending_stores: set[asyncio.Future[bool]] = set()

    @property
    def semantic(self) -> bool:
        return self.index is not None and self.embedder is not None

    async def start(self) -> None:
        await self.store.start(self.index)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="cache-sweeper")

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.settle()
        await self.store.aclose()

    async def flush(self, tenant_id: str | None = None, model: str | None = None) -> int:
        """Drops the entries of one tenant and/or model alias (None = all); returns how many."""
        return await self.store.flush(tenant_id, model)

    # --- lookups ------------------------------------------------------------------------------

    async def get_exact(self, key: str) -> CacheEntry | None:
        try:
            return await self.store.get(key)
        except Exception:
            log.warning("cache: exact lookup failed; treating as a miss", exc_info=True)
            return None

    async def embed(self, text: str) -> np.ndarray | None:
        if self.embedder is None or len(text) > self.settings.max_question_chars:
            return None
        try:
            return await self.embedder.embed(text)
        except Exception:
            log.warning("cache: embedding failed; skipping the semantic cache", exc_info=True)
            return None

    async def find_similar(self, request: CacheRequest) -> SemanticMatch | None:
        if self.index is None or request.parts is None or request.vector is None:
            return None
        neighbours = self.index.search(
            request.parts.namespace,
            request.vector,
            self.settings.candidates,
            request.policy.similarity_threshold,
        )
        question = parse(request.parts.question)
        for neighbour in neighbours:
            if request.policy.guard and conflict(question, parse(neighbour.item.question)):
                continue
            entry = await self.get_exact(neighbour.item.key)
            if entry is not None:
                return SemanticMatch(entry, neighbour.similarity)
            self.index.on_removed([neighbour.item.key])  # expired or evicted meanwhile
        return None

    # --- serving ------------------------------------------------------------------------------

    def serve(self, ctx: RequestContext, entry: CacheEntry, status: str) -> Reply:
        """A reply from the cache; nothing is consumed, so ctx.usage stays zero."""
        usage = Usage.from_openai(entry.usage())
        ctx.cache_status = status
        ctx.usage = Usage()
        ctx.extra["cache"] = {
            "status": status,
            "saved_prompt_tokens": usage.prompt_tokens,
            "saved_completion_tokens": usage.completion_tokens,
            "saved_cost_usd": entry.cost_usd,
        }
        response_id = _response_id(ctx)
        headers = {"x-cache-status": status}
        if ctx.stream:
            return Reply(stream=replay_stream(entry.answer, response_id, ctx.include_usage), headers=headers)
        return Reply(body=replay_body(entry.answer, response_id), headers=headers)

    # --- storing ------------------------------------------------------------------------------

    def store_when_complete(self, ctx: RequestContext, request: CacheRequest, reply: Reply) -> Reply:
        if reply.status != 200:
            return reply
        if reply.stream is not None:
            reply.stream = self._store_at_end(ctx, request, reply.stream)
        elif reply.body is not None:
            self._spawn_store(ctx, request, reply.body)
        return reply

    async def _store_at_end(
        self, ctx: RequestContext, request: CacheRequest, chunks: AsyncIterator[dict[str, Any]]
    ) -> AsyncIterator[dict[str, Any]]:
        collector = StreamCollector(ctx.endpoint)
        async for chunk in chunks:
            collector.add(chunk)
            yield chunk
        self._spawn_store(ctx, request, collector.answer())  # reached only when the stream ended normally

    def _spawn_store(self, ctx: RequestContext, request: CacheRequest, answer: dict[str, Any]) -> None:
        task = asyncio.ensure_future(self.store_answer(ctx, request, answer))
        self._pending_stores.add(task)
        task.add_done_callback(self._pending_stores.discard)

    async def store_answer(self, ctx: RequestContext, request: CacheRequest, answer: dict[str, Any]) -> bool:
        if not is_storable(answer, request.policy.store_truncated):
            return False
        try:
            await self.store.put(self._entry(ctx, request, answer), request.policy.max_entries)
        except Exception:
            log.warning("cache: storing an answer failed", exc_info=True)
            return False
        return True

    async def settle(self) -> None:
        """Waits for stores still in flight (tests, shutdown)."""
        if self._pending_stores:
            await asyncio.gather(*self._pending_stores, return_exceptions=True)

    def _entry(self, ctx: RequestContext, request: CacheRequest, answer: dict[str, Any]) -> CacheEntry:
        semantic = request.parts is not None and request.vector is not None
        return CacheEntry(
            key=request.key,
            tenant=request.tenant,
            model=ctx.model,
            endpoint=ctx.endpoint,
            answer=answer,
            expires_at=time.time() + request.policy.ttl_s,
            cost_usd=ctx.cost_usd,
            namespace=request.parts.namespace if semantic else None,
            question=request.parts.question if semantic else None,
            vector=request.vector if semantic else None,
        )

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval_s)
            try:
                await self.store.sweep()
                if self.index is not None:
                    self.index.sweep()
            except Exception:
                log.warning("cache: sweep failed", exc_info=True)


def _response_id(ctx: RequestContext) -> str:
    return f"{'chatcmpl' if ctx.endpoint == 'chat' else 'cmpl'}-{ctx.request_id or 'cache'}"
