"""The operator console's usage figures (GET /admin/v1/overview and /admin/v1/usage/series).

Everything is aggregated in the database (one grouped query per figure, over the usage records' `ts`
indexes); percentiles are nearest-rank (the first latency whose cumulative share reaches p), computed by
PostgreSQL's percentile_disc, and by an ordered OFFSET on SQLite, so both give the same value.
"""

import math
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import case, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from policies.tables import ApiKeyRow, UsageRow

SeriesGroup = Literal["tenant_id", "key_id", "model"]
Bucket = Literal["hour", "day"]
PERCENTILES = (("p50_latency_ms", 0.5), ("p95_latency_ms", 0.95))
MAX_SERIES = 12  # the largest groups get a series each; the rest are summed as "(other)"


_HIT = UsageRow.cache_status.in_(("hit", "semantic-hit"))


def _window(start: datetime | None, end: datetime | None) -> list[Any]:
    conditions = []
    if start is not None:
        conditions.append(UsageRow.ts >= start)
    if end is not None:
        conditions.append(UsageRow.ts < end)
    return conditions


def _figures() -> list[Any]:
    return [
        func.count().label("requests"),
        func.coalesce(func.sum(case((UsageRow.status >= 400, 1), else_=0)), 0).label("errors"),
        func.coalesce(func.sum(UsageRow.prompt_tokens), 0).label("prompt_tokens"),
        func.coalesce(func.sum(UsageRow.completion_tokens), 0).label("completion_tokens"),
        func.coalesce(func.sum(UsageRow.cost_usd), 0.0).label("cost_usd"),
        func.coalesce(func.sum(case((UsageRow.cache_status == "hit", 1), else_=0)), 0).label("exact_hits"),
        func.coalesce(func.sum(case((UsageRow.cache_status == "semantic-hit", 1), else_=0)), 0).label(
            "semantic_hits"
        ),
        func.coalesce(func.sum(case((_HIT, UsageRow.prompt_tokens), else_=0)), 0).label("hit_prompt_tokens"),
        func.coalesce(func.sum(case((_HIT, UsageRow.completion_tokens), else_=0)), 0).label(
            "hit_completion_tokens"
        ),
    ]


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    names = ("requests", "errors", "prompt_tokens", "completion_tokens", "exact_hits", "semantic_hits",
             "hit_prompt_tokens", "hit_completion_tokens")  # fmt: skip
    for name in names:
        row[name] = int(row[name] or 0)
    row["cost_usd"] = float(row["cost_usd"] or 0.0)
    row["error_rate"] = row["errors"] / row["requests"] if row["requests"] else 0.0
    return row


async def overview(
    engine: AsyncEngine, start: datetime | None, end: datetime | None, prices: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    """Totals and per-model figures over [start, end). `prices`: alias -> USD per input/output token, to
    value cache hits (the tokens a hit answered, at the alias's price: what the upstream would have cost).
    PostgreSQL reads the window once (GROUP BY ROLLUP: the models and the total together)."""
    window = _window(start, end)
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            rows = [dict(r) for r in (await conn.execute(_rollup(window))).mappings().all()]
            totals = next((r for r in rows if r["model"] is None), None) or dict.fromkeys(
                rows[0] if rows else []
            )
            models = [r for r in rows if r["model"] is not None]
        else:
            models = [dict(r) for r in (await conn.execute(_by_model(window))).mappings().all()]
            totals = dict((await conn.execute(select(*_figures()).where(*window))).mappings().one())
            await _nearest_rank(conn, window, models, totals)
    totals = totals if totals.get("requests") is not None else {**totals, "requests": 0}
    for row in [*models, totals]:
        _clean(row)
        price_in, price_out = prices.get(row.get("model") or "", (0.0, 0.0))
        row["cache_saved_usd"] = (
            row.pop("hit_prompt_tokens") * price_in + row.pop("hit_completion_tokens") * price_out
        )
        for name, _ in PERCENTILES:
            row[name] = float(row.get(name) or 0.0)
    totals.pop("model", None)
    totals["cache_saved_usd"] = sum(m["cache_saved_usd"] for m in models)
    return {"totals": totals, "models": sorted(models, key=lambda m: m["model"])}


def _rollup(window: list[Any]) -> Any:
    percentiles = [
        func.percentile_disc(p).within_group(UsageRow.latency_ms).label(name) for name, p in PERCENTILES
    ]
    return (
        select(UsageRow.model, *_figures(), *percentiles).where(*window).group_by(func.rollup(UsageRow.model))
    )


def _by_model(window: list[Any]) -> Any:
    return (
        select(UsageRow.model, *_figures()).where(*window).group_by(UsageRow.model).order_by(UsageRow.model)
    )


async def _nearest_rank(
    conn: AsyncConnection, window: list[Any], models: list[dict[str, Any]], totals: dict[str, Any]
) -> None:
    """SQLite has no percentile aggregate: the k-th smallest latency, k = ceil(p * n), one row per figure."""
    for row, extra in [*((m, [UsageRow.model == m["model"]]) for m in models), (totals, [])]:
        for name, p in PERCENTILES:
            if not row["requests"]:
                continue
            k = max(math.ceil(p * row["requests"]), 1)
            query = select(UsageRow.latency_ms).where(*window, *extra).order_by(UsageRow.latency_ms)
            row[name] = (await conn.execute(query.offset(k - 1).limit(1))).scalar()


def _bucket(conn: AsyncConnection, bucket: Bucket) -> Any:
    if conn.dialect.name == "postgresql":
        return func.date_trunc(bucket, UsageRow.ts)
    pattern = "%Y-%m-%dT%H:00:00" if bucket == "hour" else "%Y-%m-%dT00:00:00"
    return func.strftime(pattern, UsageRow.ts)


async def series(
    engine: AsyncEngine,
    group: SeriesGroup,
    bucket: Bucket,
    start: datetime | None,
    end: datetime | None,
    filters: dict[str, str],
) -> list[dict[str, Any]]:
    """Requests, tokens and spend per time bucket and group; groups past MAX_SERIES summed as '(other)'."""
    column = getattr(UsageRow, group)
    conditions = [*_window(start, end), *(getattr(UsageRow, k) == v for k, v in filters.items())]
    async with engine.connect() as conn:
        top_query = (
            select(column).where(*conditions).group_by(column)
            .order_by(func.sum(UsageRow.cost_usd).desc(), func.count().desc(), column).limit(MAX_SERIES)
        )  # fmt: skip
        top = [value for (value,) in await conn.execute(top_query)]
        at = _bucket(conn, bucket).label("t")
        label = case((column.in_(top), column), else_=literal_column("'(other)'")).label("group")
        query = (
            select(
                at,
                label,
                func.count().label("requests"),
                func.coalesce(func.sum(UsageRow.prompt_tokens + UsageRow.completion_tokens), 0).label(
                    "tokens"
                ),
                func.coalesce(func.sum(UsageRow.cost_usd), 0.0).label("cost_usd"),
            )
            .where(*conditions)
            .group_by(literal_column("1"), literal_column("2"))  # by position: the expressions hold binds
            .order_by(literal_column("1"), literal_column("2"))
        )
        rows = (await conn.execute(query)).mappings().all()
    return [
        {
            "t": _iso(row["t"]),
            "group": row["group"],
            "requests": int(row["requests"]),
            "tokens": int(row["tokens"] or 0),
            "cost_usd": float(row["cost_usd"] or 0.0),
        }
        for row in rows
    ]


def _iso(value: Any) -> str:
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return text.replace(" ", "T")[:19] + "Z"


async def active_key_counts(engine: AsyncEngine) -> dict[str, int]:
    query = (
        select(ApiKeyRow.tenant_id, func.count())
        .where(ApiKeyRow.revoked_at.is_(None))
        .group_by(ApiKeyRow.tenant_id)
    )
    async with engine.connect() as conn:
        return {tenant: int(count) for tenant, count in await conn.execute(query)}
