"""The usage page's ranked per-key totals (GET /admin/v1/usage?group_by=key_id&limit=) on SQLite and PostgreSQL:
counts summed as double precision in the database stay exact integers (far past 2**32), raw and rolled up alike,
and the index that serves a few keys' hours (migration 0004) is there."""

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, inspect

from policies.console_query import series
from policies.db import create_engine
from policies.migrate import upgrade_engine
from policies.rollups import compact, compact_all
from policies.tables import UsageRow
from policies.usage_query import aggregate_usage
from tests.policies_support import Database, database_fixture  # noqa: F401

BASE = datetime(2026, 3, 2, 0, 0)  # a Monday
BIG = 2_000_000_000  # near the largest prompt_tokens a record holds (32-bit)


def _records() -> list[dict[str, Any]]:
    rows = []
    for i in range(3000):  # 3,000 records of BIG tokens: a key's month in the trillions, past 2**32
        rows.append({
            "ts": BASE + timedelta(minutes=7 * i, seconds=i % 60), "request_id": f"r{i}", "tenant_id": f"t{i % 2}",
            "key_id": f"k{i % 4}", "model": "m", "deployment": None, "endpoint": "chat", "status": 200,
            "prompt_tokens": BIG - i, "completion_tokens": i % 1000 + 1, "cached_tokens": i * 7919 % 10007,
            "cost_usd": (i % 4 + 1) / 1e3, "latency_ms": 5.0, "cache_status": "miss",
        })  # fmt: skip
    return rows


def _expected(rows: list[dict[str, Any]], start: datetime, end: datetime) -> list[dict[str, Any]]:
    totals: dict[str, list[int]] = {}
    for r in rows:
        if start <= r["ts"] < end:
            total = totals.setdefault(r["key_id"], [0, 0, 0, 0])
            for i, name in enumerate(("prompt_tokens", "completion_tokens", "cached_tokens")):
                total[i] += r[name]
            total[3] += 1
    ranked = sorted(totals, key=lambda k: -int(k[1:]))  # spend grows with the key's number
    return [{"key_id": k, "prompt_tokens": totals[k][0], "completion_tokens": totals[k][1],
             "cached_tokens": totals[k][2], "requests": totals[k][3]} for k in ranked]  # fmt: skip


async def test_ranked_key_totals_are_exact_integers_past_32_bits(database: Database) -> None:
    rows = _records()
    engine = create_engine(database.url, database.schema)
    try:
        await upgrade_engine(engine)
        async with engine.begin() as conn:
            await conn.execute(insert(UsageRow), rows)
        # weeks, days, hours and partial edges; then part rolled up, then all
        windows = [(BASE + timedelta(minutes=13), BASE + timedelta(days=13, hours=5, minutes=2)),
                   (BASE + timedelta(hours=3), BASE + timedelta(days=2, hours=1))]  # fmt: skip
        for step in ("raw", "part rolled up", "rolled up"):
            if step != "raw":
                await (compact(engine, batch=1100) if step == "part rolled up" else compact_all(engine))
            for start, end in windows:
                got = await aggregate_usage(engine, ["key_id"], start, end, limit=3)
                want = _expected(rows, start, end)[:3]
                assert [{k: u[k] for k in want[0]} for u in got] == want, (step, start, end)
                assert all(type(u[k]) is int for u in got for k in want[0] if k != "key_id")
                assert max(u["prompt_tokens"] for u in got) > 2**32
                lines = await series(engine, "key_id", "day", start, end, {}, [want[0]["key_id"]])
                assert (
                    sum(s["requests"] for s in lines if s["group"] == want[0]["key_id"])
                    == want[0]["requests"]
                )
        async with engine.connect() as conn:
            indexes = await conn.run_sync(lambda c: inspect(c).get_indexes("usage_hourly"))
        assert {"name": "ix_usage_hourly_key", "columns": ["key_id", "hour"]} in [
            {"name": i["name"], "columns": i["column_names"]} for i in indexes
        ]
    finally:
        await engine.dispose()
