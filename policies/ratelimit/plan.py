"""Which buckets a request is checked against, from its principal and policy."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from core.context import Principal
from policies.policy import Budget, Limits, Policy
from policies.ratelimit.buckets import Bucket, Spend

DAY_TTL_S = 2 * 86_400
MONTH_TTL_S = 32 * 86_400
TENANT = "t"


def key_owner(key_id: str) -> str:
    return f"k:{key_id}"


def spend_name(owner: str, period: str) -> str:
    return f"{owner}:usd:{period}"


def admission_buckets(
    principal: Principal, policy: Policy, model: str, tokens: int, now: datetime, cost_usd: float = 0.0
) -> list[Bucket]:
    """`tokens` is reserved on TPM buckets, `cost_usd` (the estimated cost) on budgets."""
    return admission_plan(principal, policy, model).buckets(tokens, now, cost_usd)


@dataclass(frozen=True)
class AdmissionPlan:
    """The buckets of one key, policy and model, named once: a request fills in its token reservation,
    its estimated cost and the budget periods of `now`. Order: key, tenant, model limits, then budgets."""

    tenant: str
    limits: tuple[Bucket, ...]  # "tokens" buckets with cost 0: the reservation is the request's
    budgets: tuple[tuple[Budget, str, str], ...]  # (budget, owner, label); unlimited ones left out

    def buckets(self, tokens: int, now: datetime, cost_usd: float) -> list[Bucket]:
        buckets = [
            Bucket("tokens", b.name, b.scope, b.limit, tokens, b.label) if b.kind == "tokens" else b
            for b in self.limits
        ]
        for budget, owner, label in self.budgets:
            buckets += _budget_buckets(budget, self.tenant, owner, label, now, cost_usd)
        return buckets


def admission_plan(principal: Principal, policy: Policy, model: str) -> AdmissionPlan:
    tenant, key = principal.tenant_id, principal.key_id
    limits = _limit_buckets(policy.key_limits, tenant, key_owner(key), f"key {key}", 0)
    limits += _limit_buckets(policy.tenant_limits, tenant, TENANT, f"tenant {tenant}", 0)
    if model in policy.model_limits:
        label = f"tenant {tenant}, model {model}"
        limits += _limit_buckets(policy.model_limits[model], tenant, f"m:{model}", label, 0)
    budgets = (
        (policy.key_budget, key_owner(key), f"key {key}"),
        (policy.tenant_budget, TENANT, f"tenant {tenant}"),
    )
    limited = tuple(b for b in budgets if b[0].usd_per_day is not None or b[0].usd_per_month is not None)
    return AdmissionPlan(tenant, tuple(limits), limited)


class PlanCache:
    """admission_plan per (key, model with limits of its own), made again when the key's principal or
    policy object changes (every directory reload makes new ones). Bounded: emptied when full."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._plans: dict[tuple[str, str | None], tuple[Principal, Policy, AdmissionPlan]] = {}

    def get(self, principal: Principal, policy: Policy, model: str) -> AdmissionPlan:
        slot = (principal.key_id, model if model in policy.model_limits else None)
        cached = self._plans.get(slot)
        if cached is not None and cached[0] is principal and cached[1] is policy:
            return cached[2]
        if len(self._plans) >= self._size:
            self._plans.clear()
        made = admission_plan(principal, policy, model)
        self._plans[slot] = (principal, policy, made)
        return made


def spends(principal: Principal, cost_usd: float, now: datetime) -> list[Spend]:
    """The four spend counters a request adds to: key and tenant, day and month."""
    owners = [key_owner(principal.key_id), TENANT]
    return [
        Spend(spend_name(owner, period), principal.tenant_id, cost_usd, ttl)
        for owner in owners
        for period, ttl in ((day_period(now), DAY_TTL_S), (month_period(now), MONTH_TTL_S))
    ]


def day_period(now: datetime) -> str:
    return _day_name(now.year, now.month, now.day)


def month_period(now: datetime) -> str:
    return _month_name(now.year, now.month)


@lru_cache(maxsize=8)  # strftime costs ~2 µs, and every admission and settlement names its periods
def _day_name(year: int, month: int, day: int) -> str:
    return f"d:{year:04d}-{month:02d}-{day:02d}"


@lru_cache(maxsize=8)
def _month_name(year: int, month: int) -> str:
    return f"m:{year:04d}-{month:02d}"


def _limit_buckets(limits: Limits, tenant: str, name: str, label: str, tokens: int) -> list[Bucket]:
    buckets = []
    if limits.rpm is not None:
        buckets.append(Bucket("requests", f"{name}:rpm", tenant, limits.rpm, 1, label))
    if limits.tpm is not None:
        buckets.append(Bucket("tokens", f"{name}:tpm", tenant, limits.tpm, tokens, label))
    if limits.max_concurrent is not None:
        buckets.append(Bucket("concurrency", f"{name}:inflight", tenant, limits.max_concurrent, 1, label))
    return buckets


def _budget_buckets(
    budget: Budget, tenant: str, owner: str, label: str, now: datetime, cost_usd: float
) -> list[Bucket]:
    periods = ((budget.usd_per_day, day_period, _next_day), (budget.usd_per_month, month_period, _next_month))
    return [
        Bucket(
            "budget", spend_name(owner, period(now)), tenant, limit, cost_usd, label, _until(ends(now), now)
        )
        for limit, period, ends in periods
        if limit is not None
    ]


def _until(ends: datetime, now: datetime) -> float:
    return (ends - now).total_seconds()


def _next_day(now: datetime) -> datetime:
    return datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)


def _next_month(now: datetime) -> datetime:
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)
