"""Hourly usage rollups (policies/rollups.py) on SQLite and PostgreSQL: the console's and the admin API's
figures equal the raw records' before, during and after compaction, for windows with partial-hour edges
(requests, tokens and percentiles exactly; spend to the rounding of float sums);
compaction is idempotent, and replicas compacting together roll each record up once."""

import asyncio
import math
import random
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select

from policies.console_query import overview, series
from policies.db import create_engine
from policies.migrate import upgrade_engine
from policies.rollups import compact, compact_all
from policies.tables import UsageHourlyRow, UsageRow
from policies.usage_query import aggregate_usage
from tests.policies_support import Database, database_fixture  # noqa: F401

BASE = datetime(2026, 3, 1, 0, 0)
WINDOWS = [
    (None, None),
    (BASE + timedelta(minutes=17, seconds=3), BASE + timedelta(hours=20, minutes=41)),
    (
        BASE + timedelta(hours=5, minutes=1),
        BASE + timedelta(days=2, hours=7, minutes=59),
    ),  # days, hours, edges
    (BASE + timedelta(days=1), BASE + timedelta(days=3)),  # whole days only
    (
        BASE + timedelta(hours=5, minutes=1),
        BASE + timedelta(days=9, hours=7, minutes=59),
    ),  # a week, days, hours
    (BASE + timedelta(hours=2), BASE + timedelta(hours=9)),  # whole hours only
    (BASE + timedelta(hours=3, minutes=5), BASE + timedelta(hours=3, minutes=50)),  # inside one hour
    (BASE + timedelta(hours=5, minutes=30), None),
    (None, BASE + timedelta(hours=7, minutes=15)),
]


def _records(n: int = 900) -> list[dict[str, Any]]:
    rng = random.Random(46)
    rows = []
    for i in range(n):
        prompt, completion = rng.randrange(1, 500), rng.randrange(0, 200)
        rows.append({
            "ts": BASE + timedelta(seconds=rng.randrange(10 * 24 * 3600), microseconds=rng.randrange(10**6)),
            "request_id": f"r{i}", "tenant_id": f"t{i % 3}", "key_id": f"k{i % 20}",
            "model": ["m1", "m2", "m3"][rng.randrange(3)], "deployment": [None, "d1", "d2"][i % 3],
            "endpoint": "chat", "status": 500 if rng.random() < 0.1 else 200, "prompt_tokens": prompt,
            "completion_tokens": completion, "cached_tokens": i % 5, "cost_usd": (prompt + 3 * completion) / 1e6 + i * 1e-12,  # no two keys tie
            "latency_ms": round(rng.lognormvariate(4, 1.2), 3) if i % 50 else float(i % 3),
            "cache_status": ["miss", "hit", "semantic-hit", "bypass"][rng.randrange(4)],
        })  # fmt: skip
    return rows


def _inside(row: dict[str, Any], start: datetime | None, end: datetime | None) -> bool:
    return (start is None or row["ts"] >= start) and (end is None or row["ts"] < end)


def _nearest_rank(latencies: list[float], p: float) -> float:
    ordered = sorted(latencies)
    return ordered[max(math.ceil(p * len(ordered)), 1) - 1] if ordered else 0.0


def _expected(rows: list[dict[str, Any]], start: datetime | None, end: datetime | None) -> dict[str, Any]:
    inside = [r for r in rows if _inside(r, start, end)]
    models: dict[str, dict[str, Any]] = {}
    for model in sorted({r["model"] for r in inside}):
        mine = [r for r in inside if r["model"] == model]
        models[model] = {"requests": len(mine), "errors": sum(r["status"] >= 400 for r in mine),
                         "prompt_tokens": sum(r["prompt_tokens"] for r in mine),
                         "exact_hits": sum(r["cache_status"] == "hit" for r in mine),
                         "cost_usd": round(sum(r["cost_usd"] for r in mine), 7),
                         "p50": _nearest_rank([r["latency_ms"] for r in mine], 0.5),
                         "p95": _nearest_rank([r["latency_ms"] for r in mine], 0.95)}  # fmt: skip
    by_key: dict[tuple[str, str | None], list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in inside:
        total = by_key[(r["key_id"], r["deployment"])]
        total[0] += 1
        total[1] += r["completion_tokens"]
        total[2] += r["cached_tokens"]
    by_tenant: dict[str, list[Any]] = defaultdict(lambda: [0, 0, 0.0])
    for r in inside:
        by_tenant[r["tenant_id"]][0] += 1
        by_tenant[r["tenant_id"]][1] += r["prompt_tokens"]
        by_tenant[r["tenant_id"]][2] = round(by_tenant[r["tenant_id"]][2] + r["cost_usd"], 12)
    latencies = [r["latency_ms"] for r in inside]
    spend: dict[str, list[Any]] = defaultdict(lambda: [0.0, 0])
    for r in inside:
        spend[r["key_id"]][0] += r["cost_usd"]
        spend[r["key_id"]][1] += 1
    top = sorted(spend, key=lambda k: (-spend[k][0], -spend[k][1], k))[:12]
    daily: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, 0.0])
    for r in inside:
        line = daily[
            (r["ts"].strftime("%Y-%m-%dT00:00:00Z"), r["key_id"] if r["key_id"] in top else "(other)")
        ]
        line[0] += 1
        line[1] += r["prompt_tokens"] + r["completion_tokens"]
        line[2] += r["cost_usd"]
    return {"top_keys": top[:5], "daily_keys": sorted((t, g, n, tokens, round(c, 7)) for (t, g), (n, tokens, c) in daily.items()),
            "models": models, "p50": _nearest_rank(latencies, 0.5), "p95": _nearest_rank(latencies, 0.95),
            "by_key": dict(by_key), "requests": len(inside),
            "by_tenant": {t: [n, p, round(c, 7)] for t, (n, p, c) in by_tenant.items()}}  # fmt: skip


async def _measured(engine: Any, start: datetime | None, end: datetime | None) -> dict[str, Any]:
    figures = await overview(engine, start, end, {})
    models = {m["model"]: {"requests": m["requests"], "errors": m["errors"], "prompt_tokens": m["prompt_tokens"],
                           "exact_hits": m["exact_hits"], "cost_usd": round(m["cost_usd"], 7),
                           "p50": m["p50_latency_ms"], "p95": m["p95_latency_ms"]}
              for m in figures["models"]}  # fmt: skip
    usage = await aggregate_usage(engine, ["key_id", "deployment"], start, end)
    by_key = {(u["key_id"], u["deployment"]): [u["requests"], u["completion_tokens"], u["cached_tokens"]]
              for u in usage}  # fmt: skip
    tenants = await aggregate_usage(engine, ["tenant_id"], start, end)  # daily rollups for whole days
    by_tenant = {
        u["tenant_id"]: [u["requests"], u["prompt_tokens"], round(u["cost_usd"], 7)] for u in tenants
    }
    daily_tenants = await series(engine, "tenant_id", "day", start, end, {})
    assert sum(s["requests"] for s in daily_tenants) == sum(n for n, _, _ in by_tenant.values())
    daily_keys = await series(engine, "key_id", "day", start, end, {})
    top_keys = [u["key_id"] for u in await aggregate_usage(engine, ["key_id"], start, end, limit=5)]
    ranked = [u["key_id"] for u in await aggregate_usage(engine, ["key_id"], start, end, limit=12)]
    assert await series(engine, "key_id", "day", start, end, {}, ranked) == daily_keys  # the usage page's way
    hourly = await series(engine, "tenant_id", "hour", start, end, {})
    daily = await series(engine, "key_id", "day", start, end, {"model": "m2"})
    assert sum(s["requests"] for s in hourly) == figures["totals"]["requests"]
    assert sum(s["requests"] for s in daily) == models.get("m2", {}).get("requests", 0)
    totals = figures["totals"]
    return {"top_keys": top_keys, "daily_keys": [(s["t"], s["group"], s["requests"], s["tokens"], round(s["cost_usd"], 7)) for s in daily_keys],
            "models": models, "p50": totals["p50_latency_ms"] if totals["requests"] else 0.0,
            "p95": totals["p95_latency_ms"] if totals["requests"] else 0.0, "by_key": by_key,
            "requests": totals["requests"], "by_tenant": by_tenant}  # fmt: skip


async def _engine(database: Database, rows: list[dict[str, Any]]) -> Any:
    engine = create_engine(database.url, database.schema)
    await upgrade_engine(engine)
    async with engine.begin() as conn:
        await conn.execute(insert(UsageRow), rows)
    return engine


async def _all_windows_exact(engine: Any, rows: list[dict[str, Any]]) -> None:
    for start, end in WINDOWS:
        assert await _measured(engine, start, end) == _expected(rows, start, end), (start, end)


async def test_figures_equal_the_raw_records_before_during_and_after_compaction(database: Database) -> None:
    rows = _records()
    engine = await _engine(database, rows)
    try:
        await _all_windows_exact(engine, rows)  # nothing rolled up yet: all raw
        assert await compact(engine, batch=350) == 350  # part rolled up, part raw
        await _all_windows_exact(engine, rows)
        assert await compact_all(engine, batch=200) == len(rows) - 350
        assert await compact(engine) == 0  # idempotent: nothing is rolled twice
        async with engine.connect() as conn:
            rolled = (await conn.execute(select(func.sum(UsageHourlyRow.requests)))).scalar()
            assert rolled == len(rows)
        await _all_windows_exact(engine, rows)
        late = [
            {**r, "request_id": "late" + r["request_id"], "ts": r["ts"] - timedelta(minutes=1)}
            for r in rows[:40]
        ]
        async with engine.begin() as conn:  # records that arrive late for hours already rolled up
            await conn.execute(insert(UsageRow), late)
        await _all_windows_exact(engine, rows + late)
        await compact_all(engine)
        await _all_windows_exact(engine, rows + late)
    finally:
        await engine.dispose()


async def test_replicas_compacting_together_roll_each_record_up_once(database: Database) -> None:
    rows = _records(1500)
    engine = await _engine(database, rows)
    others = [create_engine(database.url, database.schema) for _ in range(3)]
    try:
        done = await asyncio.gather(*(compact_all(e, batch=100) for e in [engine, *others]))
        assert sum(done) == len(rows)
        async with engine.connect() as conn:
            assert (await conn.execute(select(func.sum(UsageHourlyRow.requests)))).scalar() == len(rows)
        await _all_windows_exact(engine, rows)
    finally:
        for e in [engine, *others]:
            await e.dispose()
