"""The operator console's usage figures (GET /admin/v1/overview and /admin/v1/usage/series).

Everything is aggregated in the database over the window's facts (policies/usage_facts.py): the hourly
rollups for its whole hours, the raw records for its partial edges and what is not rolled up yet; the sums
equal the raw records' sums. Percentiles are exact nearest-rank (the first latency whose cumulative share
reaches p), the same on SQLite and PostgreSQL.
"""

from datetime import datetime
from typing import Any, Literal

from sqlalchemy import case, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from policies.tables import ApiKeyRow
from policies.usage_facts import Window, count_sum, facts, latency_histogram, percentiles

SeriesGroup = Literal["tenant_id", "key_id", "model"]
Bucket = Literal["hour", "day"]
PERCENTILES = (("p50_latency_ms", 0.5), ("p95_latency_ms", 0.95))
MAX_SERIES = 12  # the largest groups get a series each; the rest are summed as "(other)"
HITS = ("hit", "semantic-hit")
COUNTS = ("requests", "errors", "prompt_tokens", "completion_tokens", "exact_hits", "semantic_hits",
          "hit_prompt_tokens", "hit_completion_tokens")  # fmt: skip


def _figures(f: Any) -> list[Any]:
    def where(condition: Any, column: Any) -> Any:
        return func.coalesce(func.sum(case((condition, column), else_=0)), 0)

    return [
        func.sum(f.c.requests).label("requests"),
        func.sum(f.c.errors).label("errors"),
        func.sum(f.c.prompt_tokens).label("prompt_tokens"),
        func.sum(f.c.completion_tokens).label("completion_tokens"),
        func.sum(f.c.cost_usd).label("cost_usd"),
        where(f.c.cache_status == "hit", f.c.requests).label("exact_hits"),
        where(f.c.cache_status == "semantic-hit", f.c.requests).label("semantic_hits"),
        where(f.c.cache_status.in_(HITS), f.c.prompt_tokens).label("hit_prompt_tokens"),
        where(f.c.cache_status.in_(HITS), f.c.completion_tokens).label("hit_completion_tokens"),
    ]


async def _snapshot(conn: AsyncConnection) -> AsyncConnection:
    """One snapshot for the figures and their percentiles (PostgreSQL; SQLite reads are short)."""
    if conn.dialect.name == "postgresql":
        return await conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
    return conn


async def overview(
    engine: AsyncEngine, start: datetime | None, end: datetime | None, prices: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    """Totals and per-model figures over [start, end). `prices`: alias -> USD per input/output token, to
    value cache hits (the tokens a hit answered, at the alias's price: what the upstream would have cost)."""
    window = Window(start, end)
    f = facts(window, {"model", "cache_status"}, {})
    async with engine.connect() as plain:
        conn = await _snapshot(plain)
        query = select(f.c.model, *_figures(f)).group_by(f.c.model).order_by(f.c.model)
        models = [dict(r) for r in (await conn.execute(query)).mappings().all()]
        histogram = await latency_histogram(conn, window)
        totals: dict[str, Any] = {name: sum(m[name] or 0 for m in models) for name in (*COUNTS, "cost_usd")}
        everything: dict[int, int] = {}
        for counts in histogram.values():
            for bucket, n in counts.items():
                everything[bucket] = everything.get(bucket, 0) + n
        targets = [
            *((m, [m["model"]], histogram.get(m["model"], {})) for m in models),
            (totals, [m["model"] for m in models], everything),
        ]
        wanted = [(names, counts, p) for _, names, counts in targets for _, p in PERCENTILES]
        values = iter(await percentiles(conn, window, wanted))
        for row, _, _ in targets:
            for name, _ in PERCENTILES:
                row[name] = next(values)
    for row in [*models, totals]:
        _clean(row)
        price_in, price_out = prices.get(row.get("model") or "", (0.0, 0.0))
        row["cache_saved_usd"] = (
            row.pop("hit_prompt_tokens") * price_in + row.pop("hit_completion_tokens") * price_out
        )
        for name, _ in PERCENTILES:
            row[name] = float(row.get(name) or 0.0)
    totals["cache_saved_usd"] = sum(m["cache_saved_usd"] for m in models)
    return {"totals": totals, "models": models}


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    for name in COUNTS:
        row[name] = int(row[name] or 0)
    row["cost_usd"] = float(row["cost_usd"] or 0.0)
    row["error_rate"] = row["errors"] / row["requests"] if row["requests"] else 0.0
    return row


def _bucket(conn: AsyncConnection, bucket: Bucket, ts: Any) -> Any:
    if conn.dialect.name == "postgresql":
        return func.date_trunc(bucket, ts)
    pattern = "%Y-%m-%dT%H:00:00" if bucket == "hour" else "%Y-%m-%dT00:00:00"
    return func.strftime(pattern, ts)


async def series(
    engine: AsyncEngine,
    group: SeriesGroup,
    bucket: Bucket,
    start: datetime | None,
    end: datetime | None,
    filters: dict[str, str],
    groups: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Requests, tokens and spend per time bucket and group; groups past MAX_SERIES summed as '(other)'.
    `groups`: the groups to draw (at most MAX_SERIES) when the caller has ranked them already.

    The largest groups are ranked over the coarsest rollups; their buckets are read for them alone (indexes
    on key and day, key and hour), and '(other)' is each bucket's total (a small rollup) less theirs: exact
    in requests and tokens, in spend to the last bits of a float sum."""
    window = Window(start, end)
    async with engine.connect() as plain:
        conn = await _snapshot(plain)
        ranked = facts(window, {group}, filters)
        column = ranked.c[group]
        top_query = (
            select(column).group_by(column)
            .order_by(func.sum(ranked.c.cost_usd).desc(), func.sum(ranked.c.requests).desc(), column)
            .limit(MAX_SERIES)
        )  # fmt: skip
        top = groups[:MAX_SERIES] if groups else [value for (value,) in await conn.execute(top_query)]
        lines = await _per_bucket(
            conn, facts(window, {group}, {**filters, group: top}, bucket, True), bucket, group
        )
        totals = await _per_bucket(conn, facts(window, set(), filters, bucket, True), bucket, None)
    shown: dict[str, list[Any]] = {}
    for (t, _), sums in lines.items():
        seen = shown.setdefault(t, [0, 0, 0.0])
        for i, value in enumerate(sums):
            seen[i] += value
    rows = [(t, name, sums) for (t, name), sums in lines.items()]
    for (t, _), (requests, tokens, cost) in totals.items():
        seen = shown.get(t, [0, 0, 0.0])
        if requests > seen[0]:
            rows.append((t, "(other)", [requests - seen[0], tokens - seen[1], max(cost - seen[2], 0.0)]))
    return [
        {"t": _iso(t), "group": name, "requests": sums[0], "tokens": sums[1], "cost_usd": sums[2]}
        for t, name, sums in sorted(rows, key=lambda r: (_iso(r[0]), r[1]))
    ]


async def _per_bucket(
    conn: AsyncConnection, f: Any, bucket: Bucket, group: str | None
) -> dict[tuple[Any, str | None], list[Any]]:
    """Requests, tokens and spend per bucket (and group)."""
    columns = [_bucket(conn, bucket, f.c.ts).label("t"), *([f.c[group]] if group else [])]
    sums = [
        count_sum(f.c.requests),
        count_sum(f.c.prompt_tokens + f.c.completion_tokens),
        func.sum(f.c.cost_usd),
    ]
    by_position = [literal_column(str(i + 1)) for i in range(len(columns))]  # the expressions hold binds
    result = {}
    for row in await conn.execute(select(*columns, *sums).group_by(*by_position)):
        t, name = row[0], (row[1] if group else None)
        result[(t, name)] = [int(row[-3] or 0), int(row[-2] or 0), float(row[-1] or 0.0)]
    return result


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
