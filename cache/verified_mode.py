"""Verified mode at work in a request: which candidate may serve (cache/verified.py decides), and the
labelled outcomes it learns from, all gathered off the request path:
- explored candidates: a lookup that served nothing lets the request go upstream as any miss does; once
  that reply has ended well, its answer is compared with the stored answers of the best unserved
  candidates (at most `label_candidates`), each comparison one outcome;
- shadow checks: a sampled share of verified hits (`shadow_rate`) is also answered upstream in the
  background and compared with what was served;
- feedback: a hit reported wrong is a wrong outcome at the score it was served at."""

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cache.answers import StreamCollector
from cache.config import VerifiedSettings
from cache.entry import CacheEntry
from cache.metrics import VERIFIED_OUTCOMES
from cache.shadow import AnswerMatcher, ShadowChecker
from cache.verified import Decision, VerifiedLearner
from core.context import Handler, RequestContext
from core.reply import Ending, Reply

log = logging.getLogger("llmgw.cache")
GetEntry = Callable[[str], Awaitable[CacheEntry | None]]


@dataclass(frozen=True)
class Candidate:
    """A stored question the verifier scored for a new one (probability 0: an exact rule forbids it)."""

    key: str
    namespace: str
    similarity: float
    probability: float
    rank: int = 0  # by probability among this lookup's candidates: 0 is the one that would be served


class VerifiedMode:
    def __init__(
        self, settings: VerifiedSettings, matcher: AnswerMatcher, shadow: ShadowChecker, get_entry: GetEntry
    ) -> None:
        self.settings = settings
        self.learner = VerifiedLearner(settings)
        self._matcher, self._shadow, self._get_entry = matcher, shadow, get_entry

    async def settle(self) -> None:
        """Waits for labelling and shadow checks in flight (tests, shutdown)."""
        await self._shadow.settle()

    def decide(self, candidate: Candidate, max_error: float) -> Decision:
        return self.learner.decide(candidate.namespace, candidate.key, candidate.probability, max_error)

    def record(self, candidate: Candidate, wrong: bool, source: str, served: bool = False) -> None:
        """An outcome counts for its entry; for its namespace only when it is of the candidate a lookup
        serves or would serve (the best-scored), as the namespace's threshold is about those."""
        VERIFIED_OUTCOMES.labels(source, "wrong" if wrong else "right").inc()
        pooled = served or candidate.rank == 0
        self.learner.record(candidate.namespace, candidate.key, candidate.probability, wrong, pooled)

    def after_hit(
        self, ctx: RequestContext, served: Candidate, cached: CacheEntry, call_next: Handler
    ) -> None:
        """Maybe re-asks upstream in the background, and learns from the comparison."""
        self._shadow.maybe_check(
            ctx, cached.answer, call_next, self.settings.shadow_rate,
            lambda agreed: self.record(served, not agreed, "shadow", served=True),
        )  # fmt: skip

    async def label_with_reply(self, ctx: RequestContext, reply: Reply, unserved: list[Candidate]) -> None:
        """Once the upstream reply to a lookup that served nothing has ended well, labels its candidates."""
        chosen = [c for c in unserved if c.probability > 0][: self.settings.label_candidates]
        if not chosen or reply.status != 200:
            return
        if reply.stream is None:
            if reply.body is not None:
                self._shadow.spawn(self._label(chosen, reply.body))
            return
        collector = StreamCollector(ctx.endpoint)
        reply.taps.append(collector.add)

        def label(ending: Ending) -> None:
            if ending.status == 200:
                self._shadow.spawn(self._label(chosen, collector.answer()))

        await reply.on_end(label)

    async def _label(self, chosen: list[Candidate], fresh: dict) -> None:
        for candidate in chosen:
            try:
                entry = await self._get_entry(candidate.key)
                if entry is None:
                    continue
                agreed = await self._matcher.agree(entry.answer, fresh)
                self.record(candidate, not agreed, "explored")
            except Exception:
                log.warning("cache: labelling a semantic candidate failed", exc_info=True)
