"""A window's usage as facts: the rollups for its whole weeks, days and hours, the raw records for the rest.

A window [start, end) splits into its whole hours [h0, h1) and its partial edges [start, h0), [h1, end).
The facts of the whole hours are rollup rows (weekly ones for its whole weeks, daily ones for the whole days
around them, hourly ones for the other hours, wherever a rollup of that grain has the dimensions asked for)
plus the records there not rolled up yet;
the edges are read raw. Each record is counted once (policies/rollups.py), in one statement, so one
snapshot: the sums equal the raw records' sums. Percentiles are exact nearest-rank: the latency histogram
(rollups and raw alike) names the bucket that holds the k-th latency, and the records of that bucket in the
window give its value (over the index on model and latency).
"""

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Double, Subquery, case, cast, func, literal, select, union_all
from sqlalchemy.ext.asyncio import AsyncConnection

from policies.rollups import (
    GRAINS,
    LATENCY_BOUNDS,
    MEASURES,
    ROLLUPS,
    Grain,
    Rollup,
    latency_bucket_sql,
    next_start,
    start_of,
)
from policies.tables import UsageHourlyLatencyRow, UsageRow


@dataclass(frozen=True)
class Window:
    start: datetime | None
    end: datetime | None

    def whole_hours(self) -> tuple[datetime | None, datetime | None] | None:
        """[h0, h1) (None: unbounded on that side), or None when the window holds no whole hour."""
        h0 = None if self.start is None else _ceil(self.start, "hour")
        h1 = None if self.end is None else start_of(self.end, "hour")
        if h0 is not None and h1 is not None and h0 >= h1:
            return None
        return h0, h1

    def raw_parts(self) -> list[list[Any]]:
        """The conditions of each raw part (separate, so each uses its index)."""
        hours = self.whole_hours()
        if hours is None:
            return [_range(UsageRow.ts, self.start, self.end)]
        h0, h1 = hours
        parts = [[~UsageRow.rolled, *_range(UsageRow.ts, h0, h1)]]
        if self.start is not None and h0 is not None and self.start < h0:
            parts.append(_range(UsageRow.ts, self.start, h0))
        if self.end is not None and h1 is not None and h1 < self.end:
            parts.append(_range(UsageRow.ts, h1, self.end))
        return parts

    def rollup_conditions(self, hour: Any) -> list[Any] | None:
        hours = self.whole_hours()
        return None if hours is None else _range(hour, *hours)

    def rolled_spans(self, grains: tuple[Grain, ...]) -> list[tuple[Grain, datetime | None, datetime | None]]:
        """The whole hours as rollup spans: the whole periods of the coarsest grain, then of the next one
        around them, down to hours (`grains`: coarsest first, ending with "hour")."""
        hours = self.whole_hours()
        return [] if hours is None else _spans(*hours, grains)

    def conditions(self) -> list[Any]:
        return _range(UsageRow.ts, self.start, self.end)


def _spans(
    low: datetime | None, high: datetime | None, grains: tuple[Grain, ...]
) -> list[tuple[Grain, datetime | None, datetime | None]]:
    grain = grains[0]
    if grain == "hour":
        return [("hour", low, high)]
    first = None if low is None else _ceil(low, grain)
    last = None if high is None else start_of(high, grain)
    if first is not None and last is not None and first >= last:
        return _spans(low, high, grains[1:])
    spans: list[tuple[Grain, datetime | None, datetime | None]] = [(grain, first, last)]
    if low is not None and first is not None and low < first:
        spans += _spans(low, first, grains[1:])
    if high is not None and last is not None and last < high:
        spans += _spans(last, high, grains[1:])
    return spans


def _ceil(value: datetime, grain: Grain) -> datetime:
    floor = start_of(value, grain)
    return floor if floor == value else next_start(floor, grain)


def _range(column: Any, low: datetime | None, high: datetime | None) -> list[Any]:
    return [
        c
        for c in (None if low is None else column >= low, None if high is None else column < high)
        if c is not None
    ]


def _rollup(grain: Grain, needed: set[str]) -> Rollup | None:
    return next((r for r in ROLLUPS if r.grain == grain and needed <= set(r.dims)), None)


Filters = dict[str, str | list[str]]  # column -> a value, or the values it may take


def _matches(table: Any, filters: Filters) -> list[Any]:
    return [
        getattr(table, k).in_(v) if isinstance(v, list) else getattr(table, k) == v
        for k, v in filters.items()
    ]


def facts(
    window: Window, dims: set[str], filters: Filters, coarsest: Grain = "week", with_ts: bool = False
) -> Subquery:
    """Columns: `ts` (with_ts), the `dims` (deployment '' for none) and MEASURES, over the window. Its whole
    weeks, days and hours come from the smallest rollup of that grain with the dimensions (no coarser than
    `coarsest`: the buckets a series needs), the rest raw."""
    needed = dims | set(filters)
    names = sorted(dims)
    raw_columns = [
        *([UsageRow.ts.label("ts")] if with_ts else []),
        *(func.coalesce(UsageRow.deployment, "").label(n) if n == "deployment" else getattr(UsageRow, n)
          for n in names),
        literal(1).label("requests"), case((UsageRow.status >= 400, 1), else_=0).label("errors"),
        UsageRow.prompt_tokens, UsageRow.completion_tokens, UsageRow.cached_tokens, UsageRow.cost_usd,
        UsageRow.latency_ms.label("latency_ms_sum"),
    ]  # fmt: skip
    parts = [select(*raw_columns).where(*part, *_matches(UsageRow, filters)) for part in window.raw_parts()]
    allowed = GRAINS[GRAINS.index(coarsest) :]
    tables = {g: r for g in allowed if (r := _rollup(g, needed)) is not None}
    assert "hour" in tables, needed
    for grain, low, high in window.rolled_spans(tuple(tables)):
        table = tables[grain]
        columns = [
            *([table.time.label("ts")] if with_ts else []),
            *(getattr(table.row, n) for n in names),
            *(getattr(table.row, m) for m in MEASURES),
        ]
        parts.append(select(*columns).where(*_range(table.time, low, high), *_matches(table.row, filters)))
    return union_all(*parts).subquery("facts")


def count_sum(column: Any) -> Any:
    """The sum of an integer column, added as double precision: exact (integers below 2**53 add without
    rounding, in any order) and, on PostgreSQL, about a third cheaper per fact than sum(bigint), which
    accumulates into numeric. The caller turns it back into an int."""
    return func.sum(cast(column, Double))


async def latency_histogram(conn: AsyncConnection, window: Window) -> dict[str, dict[int, int]]:
    """Requests per model and latency bucket over the window."""
    raw = union_all(
        *(select(UsageRow.model, UsageRow.latency_ms).where(*part) for part in window.raw_parts())
    )
    raw_q = raw.subquery("raw")
    parts = [
        select(raw_q.c.model, latency_bucket_sql(raw_q.c.latency_ms).label("bucket"), literal(1).label("n"))
    ]
    table = UsageHourlyLatencyRow
    rolled = window.rollup_conditions(table.hour)
    if rolled is not None:
        parts.append(select(table.model, table.bucket, table.requests.label("n")).where(*rolled))
    every = union_all(*parts).subquery("latency")
    query = select(every.c.model, every.c.bucket, func.sum(every.c.n)).group_by(every.c.model, every.c.bucket)
    histogram: dict[str, dict[int, int]] = {}
    for model, bucket, count in await conn.execute(query):
        histogram.setdefault(model, {})[int(bucket)] = int(count)
    return histogram


Percentile = tuple[list[str], dict[int, int], float]  # models, their latency histogram, p


async def percentiles(conn: AsyncConnection, window: Window, wanted: list[Percentile]) -> list[float | None]:
    """The nearest-rank p-th latency of each (models, histogram, p) over the window, in one statement."""
    queries = [(i, q) for i, w in enumerate(wanted) if (q := _percentile(window, *w)) is not None]
    found: dict[int, float] = {}
    if queries:
        parts = [select(literal(i).label("i"), q.subquery().c.latency_ms) for i, q in queries]
        found = {int(i): value for i, value in await conn.execute(union_all(*parts))}
    return [found.get(i) for i in range(len(wanted))]


def _percentile(window: Window, models: list[str], counts: dict[int, int], p: float) -> Any:
    """The query of the k-th latency: within the histogram bucket that holds it, at its rank there."""
    n = sum(counts.values())
    if n == 0 or not models:
        return None
    k, below = max(math.ceil(p * n), 1), 0
    for bucket in sorted(counts):
        if below + counts[bucket] >= k:
            break
        below += counts[bucket]
    low = LATENCY_BOUNDS[bucket - 1] if bucket > 0 else None
    high = LATENCY_BOUNDS[bucket] if bucket < len(LATENCY_BOUNDS) else None
    bounds = [c for c in (None if low is None else UsageRow.latency_ms >= low,
                          None if high is None else UsageRow.latency_ms < high) if c is not None]  # fmt: skip
    model = UsageRow.model == models[0] if len(models) == 1 else UsageRow.model.in_(models)
    query = select(UsageRow.latency_ms).where(model, *bounds, *window.conditions())
    return query.order_by(UsageRow.latency_ms).offset(k - below - 1).limit(1)
