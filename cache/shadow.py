"""Online measurement of semantic hits, and the labels verified mode learns from.

Shadow checks: for a sampled share of semantic hits (CacheSettings.shadow_sample_rate, default 2 %; in
verified mode VerifiedSettings.shadow_rate, default 10 %) the request is also sent upstream in the
background, after the cached answer went out, and the two answers compared (AnswerMatcher). The fresh
answer is not stored and not shown to anyone; its upstream cost is the price of the measurement. Counts
and the windowed estimate are in cache/metrics.py; each comparison may also be handed to a callback
(verified mode records it as a labelled outcome, cache/verified.py).

AnswerMatcher: two answers agree when their normalised texts are equal, or (answer_match "embedding")
when the cosine of their MiniLM embeddings reaches `answer_agreement` (bench/answer_agreement.py
measures how well that separates answers to the same question from answers to look-alikes)."""

import asyncio
import logging
import random
import re
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from cache.answers import StreamCollector
from cache.embedder import Embedder
from cache.metrics import FALSE_HIT_ESTIMATE, SHADOW_CHECKS
from core.context import Handler, RequestContext, UpstreamClock
from core.reply import Reply
from core.usage import Usage

log = logging.getLogger("llmgw.cache")
SHADOW_WINDOW = 200
Verdict = Callable[[bool], None]  # called with "the two answers agree"


class AnswerMatcher:
    def __init__(self, embedder: Embedder | None, method: str, agreement: float) -> None:
        self._embedder, self._method, self._agreement = embedder, method, agreement

    async def agree(self, cached: dict[str, Any], fresh: dict[str, Any]) -> bool:
        a, b = answer_text(cached), answer_text(fresh)
        if _normalised(a) == _normalised(b):
            return True
        if self._method == "exact" or self._embedder is None or not a.strip() or not b.strip():
            return False
        vectors = await asyncio.to_thread(self._embedder.encode, [a, b])
        return float(np.dot(vectors[0], vectors[1])) >= self._agreement


class ShadowChecker:
    def __init__(
        self,
        matcher: AnswerMatcher,
        sample_rate: float,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._matcher, self._rate, self._draw = matcher, sample_rate, draw
        self._recent: deque[bool] = deque(maxlen=SHADOW_WINDOW)
        self._tasks: set[asyncio.Task[None]] = set()

    def maybe_check(
        self,
        ctx: RequestContext,
        cached: dict[str, Any],
        call_next: Handler,
        rate: float | None = None,
        then: Verdict | None = None,
    ) -> bool:
        """Starts a background comparison for this hit when it is sampled (at `rate`, default the
        configured one); `then` gets the verdict. True when it was sampled."""
        rate = self._rate if rate is None else rate
        if rate <= 0 or self._draw() >= rate:
            return False
        fresh = replace(ctx, body={**ctx.body, "stream": False}, stream=False, include_usage=False,
                        headers=dict(ctx.headers), notes={}, options=dict(ctx.options),
                        usage=Usage(), upstream=UpstreamClock(), cache=None)  # fmt: skip
        fresh.body.pop("stream_options", None)
        self.spawn(self._check(fresh, cached, call_next, then))
        return True

    def spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _check(
        self, ctx: RequestContext, cached: dict[str, Any], call_next: Handler, then: Verdict | None
    ) -> None:
        try:
            answer = await full_answer(ctx, await call_next(ctx))
            if answer is None:
                return
            agreed = await self._matcher.agree(cached, answer)
            self.record(agreed)
            if then is not None:
                then(agreed)
        except Exception:
            log.warning("cache: shadow check of a semantic hit failed", exc_info=True)

    def record(self, agreed: bool) -> None:
        SHADOW_CHECKS.labels("agree" if agreed else "disagree").inc()
        self._recent.append(agreed)
        FALSE_HIT_ESTIMATE.set(1 - sum(self._recent) / len(self._recent))


async def full_answer(ctx: RequestContext, reply: Reply) -> dict[str, Any] | None:
    """The reply's complete body (a stream read to its end); None unless it succeeded."""
    answer = reply.body
    if reply.stream is not None:
        collector = StreamCollector(ctx.endpoint)
        async for chunk in reply.stream:
            collector.add(chunk)
        answer = collector.answer()
    return answer if reply.status == 200 and answer else None


def answer_text(answer: dict[str, Any]) -> str:
    choices = answer.get("choices") or [{}]
    first = choices[0]
    message = first.get("message") or {}
    return str(message.get("content") or first.get("text") or "")


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()
