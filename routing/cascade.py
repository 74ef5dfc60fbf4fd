"""Cascade stage: the small model answers first; a weak-looking answer is escalated to the large model.

It sits ABOVE the accounting stage and calls the rest of the pipeline once per model, so accounting
charges each attempt at its own deployment's prices (ctx.cost_usd accumulates). ctx.usage ends as the
sum of both attempts; the client-visible usage in the body stays the serving model's own.

Streaming clients: in "buffer" mode the small answer is produced whole (non-streamed) and judged, then
sent as a stream; the time to first token is the small model's full generation time (plus the large
model's TTFT when escalated). In "prefix" mode the small answer streams, the first `prefix_tokens`
tokens are held back and judged, and a confident prefix releases the rest live.
"""

import math
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from backends.base import UpstreamError
from core.completion import requested_completion_tokens
from core.context import Handler, Policy, RequestContext
from core.models import DeploymentConfig, cost_usd
from core.reply import Reply
from core.usage import Usage
from routing.cascade_stream import as_chunks, strip_logprobs
from routing.confidence import Scorer, choice_logprobs, choice_margins
from routing.config import CascadePolicy
from routing.escalation import EscalationShare
from routing.metrics import RoutingMetrics
from routing.policy import policy_section
from routing.prefix import render_prompt

_MAX_SHARE_WINDOWS = 1024  # escalation-share windows kept (one per distinct cascade configuration)


class CascadeStage:
    def __init__(
        self,
        cascades: list[CascadePolicy],
        scorer_for: "ScorerCache",
        deployments: dict[str, DeploymentConfig],
        metrics: RoutingMetrics,
    ) -> None:
        self._static = {c.alias: c for c in cascades}
        self._scorer_for = scorer_for
        self._deployments = deployments
        self._metrics = metrics
        self._shares: dict[str, EscalationShare] = {}  # per cascade configuration (escalate_share set)

    def set_deployments(self, deployments: dict[str, DeploymentConfig]) -> None:
        self._deployments = deployments

    def cascade_for(self, ctx: RequestContext) -> CascadePolicy | None:
        return self.cascade_named(ctx.model, ctx.policy)

    def cascade_named(self, alias: str, policy: Policy | None) -> CascadePolicy | None:
        """The cascade a caller with `policy` reaches by asking for `alias` (its tenant's first), or None."""
        tenant = policy_section(policy, "cascade", CascadePolicy)
        if tenant and tenant.alias == alias:
            return tenant
        return self._static.get(alias)

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        cascade = self.cascade_for(ctx)
        if cascade is None or ctx.endpoint == "embeddings":
            return await call_next(ctx)
        run = _Run(ctx, call_next, cascade, self._scorer_for(cascade), self)
        try:
            return await run.execute()
        finally:
            ctx.model = cascade.alias

    def share_for(self, cascade: CascadePolicy) -> EscalationShare | None:
        """The escalation-share window of this cascade configuration, when it sets `escalate_share`.
        Tenants whose cascades are configured identically share one window."""
        conf = cascade.confidence
        if conf.escalate_share is None:
            return None
        key = cascade.model_dump_json()
        share = self._shares.get(key)
        if share is None:
            if len(self._shares) >= _MAX_SHARE_WINDOWS:
                self._shares.pop(next(iter(self._shares)))  # the oldest configuration goes first
            share = self._shares[key] = EscalationShare(
                conf.escalate_share, conf.share_window, conf.share_warmup, conf.threshold
            )
        return share

    def note_escalation_cost(self, alias: str, usd: float) -> None:
        """The small attempt of an escalated request: paid for nothing the client receives."""
        self._metrics.cascade_escalation_cost.labels(alias).inc(max(usd, 0.0))

    def note_unscored(self, alias: str, reason: str) -> None:
        self._metrics.cascade_unscored.labels(alias, reason).inc()

    def note_threshold(self, alias: str, threshold: float) -> None:
        self._metrics.cascade_threshold.labels(alias).set(threshold)

    def outcome(
        self,
        ctx: RequestContext,
        cascade: CascadePolicy,
        outcome: str,
        reply: Reply,
        quality: float | None = None,
    ) -> Reply:
        """`quality`: the scorer's estimate of P(small answer correct), when it judged one."""
        ctx.cascade = outcome
        reply.headers.update({"x-cascade": outcome, "x-served-by": ctx.deployment or ""})
        self._metrics.cascade.labels(cascade.alias, outcome).inc()
        if quality is not None:
            self._metrics.cascade_quality.labels(cascade.alias, outcome).observe(min(max(quality, 0.0), 1.0))
        return reply

    def bill(
        self, ctx: RequestContext, deployment: str | None, prompt_tokens: int, completion_tokens: int
    ) -> None:
        """Charge tokens the accounting stage could not see (an aborted stream reports no usage)."""
        config = self._deployments.get(deployment or "")
        if config:
            ctx.cost_usd += cost_usd(config, prompt_tokens, completion_tokens)


class ScorerCache:
    """Builds each cascade's scorer once (learned models load a file)."""

    def __init__(self, build: Any) -> None:
        self._build = build
        self._built: dict[str, Scorer] = {}

    def __call__(self, cascade: CascadePolicy) -> Scorer:
        key = cascade.confidence.model_dump_json()
        if key not in self._built:
            self._built[key] = self._build(cascade.confidence)
        return self._built[key]


class _Run:
    """One request through a cascade."""

    def __init__(
        self,
        ctx: RequestContext,
        call_next: Handler,
        cascade: CascadePolicy,
        scorer: Scorer,
        stage: CascadeStage,
    ) -> None:
        self.ctx, self.call_next, self.cascade, self.scorer, self.stage = (
            ctx,
            call_next,
            cascade,
            scorer,
            stage,
        )
        self.body, self.stream = ctx.body, ctx.stream
        self.wants_logprobs = _asked_logprobs(ctx.endpoint, ctx.body)
        self.question = _question(ctx.endpoint, ctx.body)
        self.quality: float | None = None  # the scorer's P(small correct) for the judged answer
        self.cost_before = ctx.cost_usd  # what ctx.cost_usd held before either attempt
        self.share = stage.share_for(cascade)
        self.threshold = cascade.confidence.threshold if self.share is None else self.share.threshold()
        if self.share is not None:
            stage.note_threshold(cascade.alias, self.threshold)

    async def execute(self) -> Reply:
        if not self.scorer.needs_answer:
            return await self._route_first()
        if self.stream and self.cascade.stream_mode == "prefix":
            return await self._prefix_streamed()
        return await self._buffered()

    async def _route_first(self) -> Reply:
        """A router: the question alone decides which model answers."""
        confident = self._keeps(await self.scorer.score(self.question, []))
        alias = self.cascade.small if confident else self.cascade.large
        reply = await self._call(alias, self.body, self.stream)
        return self.stage.outcome(self.ctx, self.cascade, "small" if confident else "routed", reply)

    async def _buffered(self) -> Reply:
        small = await self._try_small(stream=False)
        if small is None:
            self._escalation_not_scored("failed")
        elif await self._accept(small.body):
            strip_logprobs(small.body, keep=self.wants_logprobs)
            if self.stream:
                small = Reply(stream=as_chunks(self.ctx.endpoint, small.body), headers=small.headers)
            return self.stage.outcome(self.ctx, self.cascade, "small", small, self.quality)
        return await self._escalate(self.ctx.usage if small is not None else Usage())

    async def _try_small(self, stream: bool) -> Reply | None:
        try:
            return await self._call(self.cascade.small, self._small_body(stream), stream)
        except UpstreamError:
            return None  # the small model failing is the plainest reason to escalate

    async def _accept(self, body: dict[str, Any]) -> bool:
        choices = body.get("choices") or []
        if not choices:
            return self._escalation_not_scored("empty")
        if any(self._truncated(c.get("finish_reason")) for c in choices):
            return self._escalation_not_scored("cut_short")
        scores = [
            await self.scorer.score(self.question, choice_logprobs(c), choice_margins(c)) for c in choices
        ]
        self.quality = self.scorer.quality(min(scores))
        return self._keeps(min(scores))

    async def _judge(self, logprobs: list[float], margins: list[float]) -> bool:
        """A streamed prefix: its tokens' logprobs and top-2 margins, as a whole answer's in `_accept`."""
        score = await self.scorer.score(self.question, logprobs, margins)
        self.quality = self.scorer.quality(score)
        return self._keeps(score)

    def _keeps(self, score: float) -> bool:
        """Whether a score keeps the small answer (or, for a router, sends the question to the small model);
        the escalation-share window, if any, learns the score."""
        if self.share is not None:
            self.share.record(score)
        return score >= self.threshold

    def _escalation_not_scored(self, reason: str) -> bool:
        """The small model failed, answered nothing or was cut short (`reason`): escalate, count it in the share
        as the lowest score, and in llmgw_cascade_unscored_escalations."""
        self.stage.note_unscored(self.cascade.alias, reason)
        if self.share is not None:
            self.share.record(-math.inf)
        return False

    def _truncated(self, finish_reason: str | None) -> bool:
        """Cut short by our max_small_tokens (not by the client's own limit): not an answer to keep."""
        return finish_reason == "length" and self._small_cap() < _client_cap(self.body)

    async def _escalate(self, small_usage: Usage) -> Reply:
        self.stage.note_escalation_cost(self.cascade.alias, self.ctx.cost_usd - self.cost_before)
        self.ctx.usage = Usage()
        reply = await self._call(self.cascade.large, self.body, self.stream)
        await reply.on_end(lambda _: self._add_usage(small_usage))
        return self.stage.outcome(self.ctx, self.cascade, "escalated", reply, self.quality)

    def _add_usage(self, small_usage: Usage) -> None:
        """ctx.usage ends as the sum of both attempts."""
        self.ctx.usage = _sum(self.ctx.usage, small_usage)

    async def _prefix_streamed(self) -> Reply:
        small = await self._try_small(stream=True)
        if small is None:
            self._escalation_not_scored("failed")
            return await self._escalate(Usage())
        deployment = self.ctx.deployment
        chunks = aiter(small.stream)
        held, logprobs, margins, ended = await self._hold_prefix(chunks)
        cut_short = ended and any(self._truncated(_finish(c)) for c in held)
        keep = self._escalation_not_scored("cut_short") if cut_short else await self._judge(logprobs, margins)
        if keep:
            reply = Reply(stream=self._release(held, chunks))
            return self.stage.outcome(self.ctx, self.cascade, "small", reply, self.quality)
        await small.stream.aclose()
        self._settle_aborted(deployment, generated=len(logprobs))
        return await self._escalate(self.ctx.usage)

    def _settle_aborted(self, deployment: str | None, generated: int) -> None:
        """A small stream cut before its usage chunk: count what it generated, estimate its prompt."""
        charged = self.ctx.usage  # what accounting charged when the stream closed
        prompt = charged.prompt_tokens or math.ceil(len(render_prompt(self.ctx.endpoint, self.body)) / 4)
        completion = max(charged.completion_tokens, generated)
        extra = (prompt - charged.prompt_tokens, completion - charged.completion_tokens)
        self.stage.bill(self.ctx, deployment, *extra)
        self.ctx.usage = Usage(prompt, completion, charged.cached_tokens)

    async def _hold_prefix(
        self, chunks: AsyncIterator[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[float], list[float], bool]:
        """The chunks up to `prefix_tokens` tokens, their logprobs and top-2 margins, and whether the stream
        ended first."""
        held: list[dict[str, Any]] = []
        logprobs: list[float] = []
        margins: list[float] = []
        async for chunk in chunks:
            held.append(chunk)
            for choice in chunk.get("choices") or []:
                logprobs += choice_logprobs(choice)
                margins += choice_margins(choice)
            if len(logprobs) >= self.cascade.prefix_tokens:
                return held, logprobs, margins, False
        return held, logprobs, margins, True

    async def _release(
        self, held: list[dict[str, Any]], rest: AsyncIterator[dict[str, Any]]
    ) -> AsyncIterator[dict[str, Any]]:
        async with aclosing(rest):
            for chunk in held:
                yield strip_logprobs(chunk, keep=self.wants_logprobs)
            async for chunk in rest:
                yield strip_logprobs(chunk, keep=self.wants_logprobs)

    async def _call(self, alias: str, body: dict[str, Any], stream: bool) -> Reply:
        self.ctx.model, self.ctx.body, self.ctx.stream = alias, body, stream
        return await self.call_next(self.ctx)

    def _small_body(self, stream: bool) -> dict[str, Any]:
        body = {**self.body, "stream": stream}
        if self._small_cap() < math.inf:
            body.pop("max_completion_tokens", None)
            body["max_tokens"] = self._small_cap()
        top = self.scorer.top_logprobs
        if self.ctx.endpoint == "chat":
            body["logprobs"] = True
            if top:
                body["top_logprobs"] = max(int(self.body.get("top_logprobs") or 0), top)
        else:
            body["logprobs"] = max(int(self.body.get("logprobs") or 0), top, 1)
        if not stream:
            body.pop("stream_options", None)
        return body

    def _small_cap(self) -> int | float:
        cap = self.cascade.max_small_tokens or math.inf
        return min(cap, _client_cap(self.body))


def _client_cap(body: dict[str, Any]) -> int | float:
    return requested_completion_tokens(body) or math.inf


def _finish(chunk: dict[str, Any]) -> str | None:
    return next((c.get("finish_reason") for c in chunk.get("choices") or [] if c.get("finish_reason")), None)


def _asked_logprobs(endpoint: str, body: dict[str, Any]) -> bool:
    return bool(body.get("logprobs")) if endpoint == "chat" else body.get("logprobs") is not None


def _question(endpoint: str, body: dict[str, Any]) -> str:
    if endpoint != "chat":
        return render_prompt(endpoint, body)
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    return content if isinstance(content, str) else render_prompt("chat", {"messages": users[-1:]})


def _sum(a: Usage, b: Usage) -> Usage:
    return Usage(a.prompt_tokens + b.prompt_tokens, a.completion_tokens + b.completion_tokens,
                 a.cached_tokens + b.cached_tokens)  # fmt: skip
