"""Rate limits and budgets on the proxy path: admit (one limiter call), then settle at reply end.

Admission reserves the estimated prompt plus the completion allowance on TPM buckets, and the estimated
cost (those tokens at the alias's dearest deployment prices) on budgets; settlement re-weights the TPM
entries to the usage the upstream reported, swaps the budget reservation for the real cost, releases
concurrency. Settlement is the reply's end hook (core/reply.py), so streams settle when they end,
cancelled ones (what was produced, as ctx.usage says) and never-started ones included; while a request
runs, its slot and reservation leases are renewed (leases.py). The usage record is accounting's
(policies/accounting.py). Rate-limit headers travel on every reply and error.
The admission is the request path's only Redis round trip: settlement is queued on the limiter's
pipelined connection (ahead of any later admission) and its reply is not awaited.
"""

import asyncio
import itertools
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from core.context import Handler, RequestContext
from core.errors import OpenAIError
from core.reply import CLIENT_CLOSED, Ending, Reply
from policies.metrics import RATE_LIMITED
from policies.ratelimit import estimate, plan
from policies.ratelimit.buckets import Bucket, Limiter, Spend
from policies.ratelimit.leases import LeaseKeeper
from policies.ratelimit.responses import rate_headers, rejection

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admission:
    member: str
    buckets: list[Bucket]
    headers: dict[str, str]
    prompt_estimate: int


_MEMBER_PREFIX = secrets.token_hex(8)  # unique across replicas; then a counter: no getrandom() per request
_members = itertools.count()


def new_member() -> str:
    """A concurrency-lease member id, 32 hex characters like uuid4().hex, without a syscall."""
    return f"{_MEMBER_PREFIX}{next(_members):016x}"


CostEstimate = Callable[[str, int, int], float]  # (model, prompt tokens, completion tokens) -> USD


class RateLimitStage:
    def __init__(
        self,
        limiter: Limiter,
        reserve_completion_tokens: int,
        lease_s: float = 30.0,
        estimate_cost: CostEstimate = lambda model, prompt, completion: 0.0,
    ) -> None:
        self._limiter = limiter
        self._reserve_completion_tokens = reserve_completion_tokens
        self._leases = LeaseKeeper(limiter, lease_s)
        self._estimate_cost = estimate_cost
        self._plans = plan.PlanCache()

    async def drain(self) -> None:
        """Wait for settlements still on their way to the limiter (tests)."""
        await self._limiter.drain()

    async def aclose(self) -> None:
        await self._leases.aclose()
        await self._limiter.aclose()

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        admission = await self._admit(ctx)
        try:
            reply = await call_next(ctx)
        except BaseException as exc:
            if isinstance(exc, OpenAIError):
                exc.headers = {**admission.headers, **exc.headers}
            status = exc.status if isinstance(exc, OpenAIError) else 500
            await asyncio.shield(self._settle(ctx, admission, status))
            raise
        reply.headers = {**admission.headers, **reply.headers}

        async def settle(ending: Ending) -> None:
            await self._settle(ctx, admission, ending.status)

        await reply.on_end(settle)
        return reply

    async def _admit(self, ctx: RequestContext) -> Admission:
        prompt = estimate.prompt_tokens(ctx.endpoint, ctx.body)
        member = new_member()
        if ctx.policy is None or ctx.principal is None:
            return Admission(member, [], {}, prompt)
        default = ctx.policy.reserve_completion_tokens or self._reserve_completion_tokens
        completion = estimate.completion_tokens(ctx.endpoint, ctx.body, default)
        cost = self._estimate_cost(ctx.model, prompt, completion)
        admitting = self._plans.get(ctx.principal, ctx.policy, ctx.model)
        buckets = admitting.buckets(prompt + completion, datetime.now(UTC), cost)
        if not buckets:
            return Admission(member, [], {}, prompt)
        decision = await self._limiter.admit(member, buckets, ctx.policy.redis_failure_mode)
        if decision.failed is not None:
            RATE_LIMITED.labels(kind=decision.failed.bucket.kind).inc()
            raise rejection(decision)
        self._leases.hold(member, buckets)
        return Admission(member, buckets, rate_headers(decision), prompt)

    async def _settle(self, ctx: RequestContext, admission: Admission, status: int) -> None:
        principal = ctx.principal
        if principal is None:
            return
        spends = plan.spends(principal, ctx.cost_usd, datetime.now(UTC)) if ctx.cost_usd > 0 else []
        self._leases.release(admission.member)
        if admission.buckets or (spends and principal.tenant_id != "master"):
            tokens = settled_tokens(ctx, admission.prompt_estimate, status)
            await self._settle_limits(ctx, admission, tokens, spends)

    async def _settle_limits(
        self, ctx: RequestContext, admission: Admission, tokens: int, spends: list[Spend]
    ) -> None:
        try:  # queues the limiter's call; its reply is not awaited (see RedisLimiter.settle)
            await self._limiter.settle(admission.member, admission.buckets, tokens, spends)
        except Exception:  # the answer is already out; limits heal as their windows roll and leases expire
            log.exception("settling request %s failed", ctx.request_id)


def settled_tokens(ctx: RequestContext, prompt_estimate: int, status: int) -> int:
    """The real usage; the prompt estimate stands in when a served request reported no prompt usage."""
    usage = ctx.usage
    if usage.prompt_tokens or status not in (200, CLIENT_CLOSED):
        return usage.total_tokens
    return prompt_estimate + usage.completion_tokens
