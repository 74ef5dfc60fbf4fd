"""Online measurement of semantic hits. For a sampled share of them (CacheSettings.shadow_sample_rate,
default 2 %) the request is also sent upstream in the background, after the cached answer went out, and
the two answers compared by the cosine of their MiniLM embeddings: below `shadow_agreement` the hit
counts as a likely false hit. The fresh answer is not stored and not shown to anyone; its upstream cost
is the price of the measurement. Counts and the windowed estimate are in cache/metrics.py."""

import asyncio
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from cache.answers import StreamCollector
from cache.embedder import Embedder
from cache.metrics import FALSE_HIT_ESTIMATE, SHADOW_CHECKS
from core.context import Handler, RequestContext, UpstreamClock
from core.usage import Usage

log = logging.getLogger("llmgw.cache")
SHADOW_WINDOW = 200


class ShadowChecker:
    def __init__(
        self,
        embedder: Embedder,
        sample_rate: float,
        agreement: float,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._embedder, self._rate, self._agreement, self._draw = embedder, sample_rate, agreement, draw
        self._recent: deque[bool] = deque(maxlen=SHADOW_WINDOW)
        self._tasks: set[asyncio.Task[None]] = set()

    def maybe_check(self, ctx: RequestContext, cached: dict[str, Any], call_next: Handler) -> bool:
        """Starts a background comparison for this hit when it is sampled; True when it was."""
        if self._rate <= 0 or self._draw() >= self._rate:
            return False
        fresh = replace(ctx, body={**ctx.body, "stream": False}, stream=False, include_usage=False,
                        headers=dict(ctx.headers), notes={}, options=dict(ctx.options),
                        usage=Usage(), upstream=UpstreamClock(), cache=None)  # fmt: skip
        fresh.body.pop("stream_options", None)
        task = asyncio.create_task(self._check(fresh, cached, call_next), name="cache-shadow")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def settle(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _check(self, ctx: RequestContext, cached: dict[str, Any], call_next: Handler) -> None:
        try:
            reply = await call_next(ctx)
            answer = reply.body
            if reply.stream is not None:
                collector = StreamCollector(ctx.endpoint)
                async for chunk in reply.stream:
                    collector.add(chunk)
                answer = collector.answer()
            if reply.status != 200 or not answer:
                return
            texts = [answer_text(cached), answer_text(answer)]
            vectors = await asyncio.to_thread(self._embedder.encode, texts)
            self.record(float(np.dot(vectors[0], vectors[1])) >= self._agreement)
        except Exception:
            log.warning("cache: shadow check of a semantic hit failed", exc_info=True)

    def record(self, agreed: bool) -> None:
        SHADOW_CHECKS.labels("agree" if agreed else "disagree").inc()
        self._recent.append(agreed)
        FALSE_HIT_ESTIMATE.set(1 - sum(self._recent) / len(self._recent))


def answer_text(answer: dict[str, Any]) -> str:
    choices = answer.get("choices") or [{}]
    first = choices[0]
    message = first.get("message") or {}
    return str(message.get("content") or first.get("text") or "")
