"""Start-up reload of the spend counters from the usage records (Redis keeps its own if newer)."""

from collections import defaultdict
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from policies.ratelimit import plan
from policies.ratelimit.buckets import Limiter, Spend
from policies.usage_query import spend_since


async def seed_spend(engine: AsyncEngine, limiter: Limiter, now: datetime) -> int:
    """`now` is aware UTC; returns how many counters were offered to the limiter."""
    day = datetime(now.year, now.month, now.day)
    month = datetime(now.year, now.month, 1)
    spends = _spends(await spend_since(engine, day), plan.day_period(now), plan.DAY_TTL_S)
    spends += _spends(await spend_since(engine, month), plan.month_period(now), plan.MONTH_TTL_S)
    await limiter.seed_spend(spends)
    return len(spends)


def _spends(by_key: dict[tuple[str, str], float], period: str, ttl: int) -> list[Spend]:
    by_tenant: dict[str, float] = defaultdict(float)
    spends = []
    for (tenant, key), usd in by_key.items():
        if tenant == "master":
            continue
        by_tenant[tenant] += usd
        spends.append(Spend(plan.spend_name(plan.key_owner(key), period), tenant, usd, ttl))
    spends += [Spend(plan.spend_name(plan.TENANT, period), t, usd, ttl) for t, usd in by_tenant.items()]
    return spends
