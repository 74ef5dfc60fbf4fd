"""Aggregated usage over a time range, and the spend totals reloaded into the limiter at start."""

from datetime import datetime
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from policies.tables import UsageRow

GroupBy = Literal["tenant_id", "key_id", "model", "deployment", "cache_status"]


async def aggregate_usage(
    engine: AsyncEngine,
    group_by: list[GroupBy],
    start: datetime | None = None,
    end: datetime | None = None,
    filters: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    columns = [getattr(UsageRow, name) for name in group_by]
    query = select(*columns, *_totals()).group_by(*columns).order_by(*columns)
    query = query.where(*_conditions(start, end, filters or {}))
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [_clean(dict(row)) for row in rows]


async def spend_since(engine: AsyncEngine, since: datetime) -> dict[tuple[str, str], float]:
    """Spend per (tenant_id, key_id) since a time."""
    columns = (UsageRow.tenant_id, UsageRow.key_id)
    query = select(*columns, func.sum(UsageRow.cost_usd)).where(UsageRow.ts >= since).group_by(*columns)
    async with engine.connect() as conn:
        return {(tenant, key): float(total or 0) for tenant, key, total in await conn.execute(query)}


def _totals() -> list[Any]:
    return [
        func.count().label("requests"),
        func.coalesce(func.sum(UsageRow.prompt_tokens), 0).label("prompt_tokens"),
        func.coalesce(func.sum(UsageRow.completion_tokens), 0).label("completion_tokens"),
        func.coalesce(func.sum(UsageRow.cached_tokens), 0).label("cached_tokens"),
        func.coalesce(func.sum(UsageRow.cost_usd), 0.0).label("cost_usd"),
        func.avg(UsageRow.latency_ms).label("avg_latency_ms"),
    ]


def _conditions(start: datetime | None, end: datetime | None, filters: dict[str, str]) -> list[Any]:
    conditions = [getattr(UsageRow, name) == value for name, value in filters.items()]
    if start is not None:
        conditions.append(UsageRow.ts >= start)
    if end is not None:
        conditions.append(UsageRow.ts < end)
    return conditions


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    for name in ("requests", "prompt_tokens", "completion_tokens", "cached_tokens"):
        row[name] = int(row[name])
    row["cost_usd"] = float(row["cost_usd"])
    row["avg_latency_ms"] = float(row["avg_latency_ms"] or 0.0)
    return row
