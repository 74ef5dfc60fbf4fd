"""Rollups of the usage records (hourly; daily and weekly for tenants and keys), kept by a compaction that is exact,
idempotent and safe on replicas.

A compaction claims a batch of records not yet rolled up (`rolled` false), marks them rolled and adds their
sums to the rollup rows of their hour (day), all in one transaction: a record is in every rollup exactly when
it is marked, whatever crashes or retries. On PostgreSQL the claim is `FOR UPDATE SKIP LOCKED`, so replicas
compacting together take disjoint batches, and rollup rows are upserted in one order (no deadlocks); SQLite
runs one writer at a time. The queries (policies/usage_facts.py) read each record exactly once: from a rollup
for the whole hours (days) of a window where it is rolled, raw otherwise (the window's partial hours, and
records not compacted yet), so their totals equal the raw records' whenever the compaction runs.

ROLLUPS: `usage_hourly` (tenant, key, model, deployment, cache status), `usage_hourly_models` (model,
deployment, cache status: the overview, a few rows an hour), `usage_daily_tenants`, `usage_daily_keys` and
`usage_weekly_keys` (a month of 10,000 keys in ~40,000 rows rather than ~300,000 daily ones);
and `usage_hourly_latency` (requests per model and latency bucket, LATENCY_BOUNDS, from which
policies/usage_facts.py finds exact percentiles).
"""

import asyncio
import logging
from bisect import bisect_right
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Row, Table, case, func, literal_column, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from policies.tables import (
    UsageDailyKeyRow,
    UsageDailyTenantRow,
    UsageHourlyLatencyRow,
    UsageHourlyModelRow,
    UsageHourlyRow,
    UsageRow,
    UsageWeeklyKeyRow,
)

log = logging.getLogger(__name__)

# Latency buckets: bucket i holds LATENCY_BOUNDS[i-1] <= ms < LATENCY_BOUNDS[i] (0.25 ms … ~2 h, 19 % wide).
LATENCY_BOUNDS: tuple[float, ...] = tuple(0.25 * 2 ** (i / 4) for i in range(100))
MEASURES = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd",
            "latency_ms_sum")  # fmt: skip
COMPACT_BATCH = 5000  # records per transaction
COMPACT_INTERVAL_S = 30.0  # how often each replica compacts (whoever claims a record first rolls it up)

_RAW = (UsageRow.ts, UsageRow.tenant_id, UsageRow.key_id, UsageRow.model, UsageRow.deployment,
        UsageRow.cache_status, UsageRow.status, UsageRow.prompt_tokens, UsageRow.completion_tokens,
        UsageRow.cached_tokens, UsageRow.cost_usd, UsageRow.latency_ms)  # fmt: skip
Grain = Literal["hour", "day", "week"]
GRAINS: tuple[Grain, ...] = ("week", "day", "hour")  # coarsest first


@dataclass(frozen=True)
class Rollup:
    row: Any  # the table's ORM class; its time column is named after the grain ("hour", "day", "week")
    grain: Grain
    dims: tuple[str, ...]  # deployment is '' for none

    @property
    def table(self) -> Table:
        return self.row.__table__

    @property
    def time(self) -> Any:
        return getattr(self.row, self.grain)


ROLLUPS = (  # the smallest one that has the dimensions a query needs serves it (usage_facts.py)
    Rollup(UsageHourlyModelRow, "hour", ("model", "deployment", "cache_status")),
    Rollup(UsageHourlyRow, "hour", ("tenant_id", "key_id", "model", "deployment", "cache_status")),
    Rollup(UsageDailyTenantRow, "day", ("tenant_id",)),
    Rollup(UsageDailyKeyRow, "day", ("tenant_id", "key_id")),
    Rollup(UsageWeeklyKeyRow, "week", ("tenant_id", "key_id")),
)


def latency_bucket(ms: float) -> int:
    return bisect_right(LATENCY_BOUNDS, ms)


def latency_bucket_sql(column: Any) -> Any:
    """The same bucket in SQL (the same float bounds, so the same answer)."""
    return case(
        *((column < bound, index) for index, bound in enumerate(LATENCY_BOUNDS)), else_=len(LATENCY_BOUNDS)
    )


def start_of(ts: datetime, grain: Grain) -> datetime:
    """The start of the hour, the day (UTC) or the week (Monday 00:00 UTC) that holds ts."""
    hour = ts.replace(minute=0, second=0, microsecond=0)
    if grain == "hour":
        return hour
    day = hour.replace(hour=0)
    return day if grain == "day" else day - timedelta(days=day.weekday())


def next_start(start: datetime, grain: Grain) -> datetime:
    return start + {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}[grain]


async def compact(engine: AsyncEngine, batch: int = COMPACT_BATCH) -> int:
    """Roll up to `batch` records not rolled up yet, in one transaction; returns how many it rolled."""
    claim = select(UsageRow.id).where(~UsageRow.rolled).order_by(UsageRow.id).limit(batch)
    async with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            marked = update(UsageRow).where(
                UsageRow.id.in_(claim.with_for_update(skip_locked=True).scalar_subquery())
            )
            return int((await conn.execute(_in_postgresql(marked.values(rolled=True)))).scalar() or 0)
        marked = update(UsageRow).where(UsageRow.id.in_(claim.scalar_subquery())).values(rolled=True)
        rows = (await conn.execute(marked.returning(*_RAW))).all()
        if rows:
            await _add(conn, rows)
    return len(rows)


def _in_postgresql(marked: Any) -> Any:
    """One statement: the claim, and each rollup's sums of the claimed records added in key order (the same
    sums _add makes, aggregated by the server rather than in this process)."""
    claimed = marked.returning(*_RAW).cte("claimed")
    c = claimed.c
    values = [func.count(), func.sum(case((c.status >= 400, 1), else_=0)), func.sum(c.prompt_tokens),
              func.sum(c.completion_tokens), func.sum(c.cached_tokens), func.sum(c.cost_usd), func.sum(c.latency_ms)]  # fmt: skip
    steps = []
    for i, rollup in enumerate(ROLLUPS):
        keys = [func.date_trunc(rollup.grain, c.ts),
                *(func.coalesce(c[n], "") if n == "deployment" else c[n] for n in rollup.dims)]  # fmt: skip
        steps.append(_adding(rollup.table, keys, values, MEASURES, claimed, f"add{i}"))
    latency = [func.date_trunc("hour", c.ts), c.model, latency_bucket_sql(c.latency_ms)]
    steps.append(
        _adding(UsageHourlyLatencyRow.__table__, latency, [func.count()], ("requests",), claimed, "lat")
    )  # type: ignore[arg-type]
    return select(func.count()).select_from(claimed).add_cte(*steps)


def _adding(
    table: Table, keys: list[Any], values: list[Any], measures: tuple[str, ...], claimed: Any, name: str
) -> Any:
    positions = [literal_column(str(i + 1)) for i in range(len(keys))]
    rows = select(*keys, *values).select_from(claimed).group_by(*positions).order_by(*positions)
    names = [col.name for col in table.primary_key.columns]
    insert = postgresql_insert(table).from_select([*names, *measures], rows)
    upsert = insert.on_conflict_do_update(
        index_elements=names, set_={m: table.c[m] + insert.excluded[m] for m in measures}
    )
    return upsert.cte(name)


async def compact_all(engine: AsyncEngine, batch: int = COMPACT_BATCH) -> int:
    """Compact until nothing is left (a backfill after an upgrade or a bulk load); returns how many."""
    total = 0
    while (done := await compact(engine, batch)) > 0:
        total += done
    return total


async def _add(conn: AsyncConnection, rows: Sequence[Row[Any]]) -> None:
    sums: list[dict[tuple[Any, ...], list[Any]]] = [{} for _ in ROLLUPS]
    latency: dict[tuple[Any, ...], list[Any]] = {}
    for row in rows:
        values = (1, int(row.status >= 400), row.prompt_tokens, row.completion_tokens, row.cached_tokens,
                  row.cost_usd, row.latency_ms)  # fmt: skip
        for rollup, table_sums in zip(ROLLUPS, sums, strict=True):
            key = (start_of(row.ts, rollup.grain), *(getattr(row, n) or "" for n in rollup.dims))
            total = table_sums.setdefault(key, [0, 0, 0, 0, 0, 0.0, 0.0])
            for i, value in enumerate(values):
                total[i] += value
        latency.setdefault((start_of(row.ts, "hour"), row.model, latency_bucket(row.latency_ms)), [0])[0] += 1
    for rollup, table_sums in zip(ROLLUPS, sums, strict=True):
        await _upsert(conn, rollup.table, table_sums, MEASURES)
    await _upsert(conn, UsageHourlyLatencyRow.__table__, latency, ("requests",))  # type: ignore[arg-type]


async def _upsert(
    conn: AsyncConnection, table: Table, sums: dict[tuple[Any, ...], list[Any]], measures: tuple[str, ...]
) -> None:
    """Add the sums to their rows (created at zero), in key order so that concurrent compactions never
    wait on each other in a cycle."""
    keys = [c.name for c in table.primary_key.columns]
    insert = postgresql_insert(table) if conn.dialect.name == "postgresql" else sqlite_insert(table)
    upsert = insert.on_conflict_do_update(
        index_elements=keys, set_={m: table.c[m] + insert.excluded[m] for m in measures}
    )
    params = [dict(zip((*keys, *measures), (*key, *sums[key]), strict=True)) for key in sorted(sums)]
    for first in range(0, len(params), 1000):
        await conn.execute(upsert, params[first : first + 1000])


class RollupCompactor:
    """Compacts every `interval_s` (policies.usage_rollup_interval_s) off the request path, `batch` records a
    transaction; a failure waits for the next round."""

    def __init__(
        self, engine: AsyncEngine, interval_s: float = COMPACT_INTERVAL_S, batch: int = COMPACT_BATCH
    ) -> None:
        self._engine = engine
        self._interval_s = interval_s
        self._batch = batch
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="usage-rollups")

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                while not self._stopping.is_set() and await compact(self._engine, self._batch) == self._batch:
                    pass
            except Exception as exc:  # the database is away: the records wait, the queries read them raw
                log.warning("rolling up usage records failed (%s); next try in %.0fs", type(exc).__name__,
                            self._interval_s)  # fmt: skip
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)

    async def aclose(self) -> None:
        self._stopping.set()
        if self._task is not None:
            with suppress(asyncio.CancelledError):
                await self._task
