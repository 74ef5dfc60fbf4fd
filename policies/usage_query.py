"""Aggregated usage over a time range (policies/usage_facts.py), and the spend totals reloaded into the limiter
at start."""

from datetime import datetime
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from policies.tables import UsageRow
from policies.usage_facts import Window, count_sum, facts

GroupBy = Literal["tenant_id", "key_id", "model", "deployment", "cache_status"]


async def aggregate_usage(
    engine: AsyncEngine,
    group_by: list[GroupBy],
    start: datetime | None = None,
    end: datetime | None = None,
    filters: dict[str, str] | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Sums over the window's facts (rollups for its whole hours, days and weeks, raw records for the rest),
    ordered by the groups; with `limit`, only the `limit` groups with the most spend, those first."""
    f = facts(Window(start, end), set(group_by), dict(filters or {}))
    columns = [func.nullif(f.c[n], "").label(n) if n == "deployment" else f.c[n] for n in group_by]
    query = select(*columns, *_totals(f)).group_by(*columns)
    if limit is None:
        query = query.order_by(*columns)
    else:
        query = query.order_by(func.sum(f.c.cost_usd).desc(), count_sum(f.c.requests).desc(), *columns)
        query = query.limit(limit)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [_clean(dict(row)) for row in rows]


async def spend_since(engine: AsyncEngine, since: datetime) -> dict[tuple[str, str], float]:
    """Spend per (tenant_id, key_id) since a time."""
    columns = (UsageRow.tenant_id, UsageRow.key_id)
    query = select(*columns, func.sum(UsageRow.cost_usd)).where(UsageRow.ts >= since).group_by(*columns)
    async with engine.connect() as conn:
        return {(tenant, key): float(total or 0) for tenant, key, total in await conn.execute(query)}


def _totals(f: Any) -> list[Any]:
    return [
        count_sum(f.c.requests).label("requests"),
        count_sum(f.c.prompt_tokens).label("prompt_tokens"),
        count_sum(f.c.completion_tokens).label("completion_tokens"),
        count_sum(f.c.cached_tokens).label("cached_tokens"),
        func.sum(f.c.cost_usd).label("cost_usd"),
        func.sum(f.c.latency_ms_sum).label("latency_ms_sum"),
    ]


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    for name in ("requests", "prompt_tokens", "completion_tokens", "cached_tokens"):
        row[name] = int(row[name])
    row["cost_usd"] = float(row["cost_usd"])
    total = float(row.pop("latency_ms_sum") or 0.0)
    row["avg_latency_ms"] = total / row["requests"] if row["requests"] else 0.0
    return row
