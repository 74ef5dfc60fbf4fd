"""Load time of the operator console's pages with 10,000 keys and 1,000,000 usage rows in PostgreSQL.

    python -m bench.console_load [--rows 1000000 --keys 10000 --tenants 1000 --reseed --rounds 7 --browser]

Seeds its own database (llmgw_console_bench on 127.0.0.1:5432, trust auth) once, migrated by `llmgw migrate`'s
code; usage spread over 30 days, then rolled up into the hourly rollups (policies/rollups.py) as the gateway's
compaction does. A gateway (PostgreSQL, admin token) runs in front of a fake upstream; after a
sign-in, each page's admin/console calls are made together, as the page makes them, and timed end to end (the
median and worst of --rounds after one warm-up). --browser also times Chromium from navigation to the page
drawn (data-ready). Prints a table and writes bench/results/console_load.json.
"""

import argparse
import asyncio
import hashlib
import json
import random
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from gateway.app import create_app
from gateway.settings import Settings
from policies.db import create_engine
from policies.migrate import upgrade_engine
from policies.rollups import compact_all
from tests.conftest import fake_models
from tests.fakes import FakeUpstream, ServerThread

DATABASE = "llmgw_console_bench"
SERVER = "postgresql://postgres@127.0.0.1:5432"
TOKEN = "bench-console-token"
RESULTS = Path(__file__).resolve().parent / "results" / "console_load.json"
MODELS = ["fake-model", "gpt-small", "gpt-large", "embed"]
STATUSES = ["miss"] * 6 + ["hit", "semantic-hit", "bypass", "bypass"]


async def prepare(rows: int, keys: int, tenants: int, reseed: bool) -> str:
    admin = await asyncpg.connect(SERVER + "/test")
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE)
        if exists and reseed:
            await admin.execute(f'DROP DATABASE "{DATABASE}" WITH (FORCE)')
        if not exists or reseed:
            await admin.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await admin.close()
    url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{DATABASE}"
    engine = create_engine(url)
    await upgrade_engine(engine)
    conn = await asyncpg.connect(f"{SERVER}/{DATABASE}")
    try:
        have = await conn.fetchval("SELECT count(*) FROM usage_records")
        if have != rows or await conn.fetchval("SELECT count(*) FROM api_keys") != keys:
            await seed(conn, rows, keys, tenants)
        started = time.perf_counter()
        if rolled := await compact_all(engine):  # what the gateway's compaction does in the background
            print(f"rolled {rolled:,} usage records up in {time.perf_counter() - started:.0f} s")
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
        await engine.dispose()
    return url


async def seed(conn: asyncpg.Connection, rows: int, keys: int, tenants: int) -> None:
    started = time.perf_counter()
    for table in ("usage_records", "api_keys", "tenants", "policies"):
        await conn.execute(f"DELETE FROM {table}")
    now = datetime.utcnow().replace(microsecond=0)
    spec = json.dumps({"tenant_budget": {"usd_per_day": 50.0}, "key_limits": {"rpm": 600}})
    await conn.execute("INSERT INTO policies VALUES ('pol_bench', 'bench', $1, $2, $2)", spec, now)
    await conn.copy_records_to_table("tenants", records=[
        (f"t{i:04d}", f"Tenant {i}", "pol_bench", now) for i in range(tenants)
    ], columns=["id", "name", "policy_id", "created_at"])  # fmt: skip
    key_rows = [(f"key_{i:05d}", f"t{i % tenants:04d}", f"key {i}", f"sk-gw-{i:05d}",
                 hashlib.sha256(f"secret-{i}".encode()).hexdigest(), None, now, None, None) for i in range(keys)]  # fmt: skip
    await conn.copy_records_to_table("api_keys", records=key_rows, columns=[
        "id", "tenant_id", "name", "prefix", "key_hash", "policy_id", "created_at", "expires_at", "revoked_at"])  # fmt: skip
    rng = random.Random(46)
    span = 30 * 86400

    def record(i: int) -> tuple[Any, ...]:
        key = rng.randrange(keys)
        model = MODELS[rng.randrange(len(MODELS))]
        prompt, completion = rng.randrange(10, 2000), rng.randrange(1, 500)
        return (now - timedelta(seconds=rng.randrange(span)), f"req{i}", f"t{key % tenants:04d}", f"key_{key:05d}",
                model, model + "-1", "chat", 500 if rng.random() < 0.01 else 200, prompt, completion, 0,
                (prompt + 2 * completion) / 1e6, rng.lognormvariate(5, 1), STATUSES[rng.randrange(len(STATUSES))])  # fmt: skip

    columns = ["ts", "request_id", "tenant_id", "key_id", "model", "deployment", "endpoint", "status",
               "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "latency_ms", "cache_status"]  # fmt: skip
    for first in range(0, rows, 100_000):
        batch = [record(i) for i in range(first, min(first + 100_000, rows))]
        await conn.copy_records_to_table("usage_records", records=batch, columns=columns)
    print(
        f"seeded {rows:,} usage rows, {keys:,} keys, {tenants:,} tenants in {time.perf_counter() - started:.0f} s"
    )


def window(seconds: int) -> dict[str, str]:
    end = datetime.utcnow().replace(microsecond=0) + timedelta(seconds=1)
    return {"start": (end - timedelta(seconds=seconds)).isoformat() + "Z", "end": end.isoformat() + "Z"}


Call = tuple[Any, ...]  # (path, params) or (path, params, a function of its answer giving the next call)


def pages() -> dict[str, list[Call]]:
    """The calls each page makes when it opens (gateway/ui/static/js/*.js), for the default 24-hour window
    and the widest one (30 days); calls made from another's answer follow it."""
    day, month = window(86400), window(30 * 86400)
    today = {"start": datetime.utcnow().strftime("%Y-%m-%dT00:00:00Z")}
    admin = "/ui/api/admin/"
    return {
        "index + static": [("/ui/", {}), ("/ui/static/js/app.js", {}), ("/ui/static/app.css", {})],
        "overview (24 h)": [(admin + "overview", day), ("/ui/api/runtime", {})],
        "overview (30 d)": [(admin + "overview", month), ("/ui/api/runtime", {})],
        "tenants and keys": [(admin + "tenants", {}), (admin + "policies", {}), (admin + "key-counts", {}),
                             (admin + "usage", {"group_by": "tenant_id", **today})],
        "policies": [(admin + "policies", {})],
        "models and routing": [(admin + "models", {}), ("/ui/api/runtime", {})],
        "usage by model (24 h)": [(admin + "usage", {"group_by": "model", "limit": 200, **day},
                                   then_series("model", "hour", day))],
        "usage by key (30 d)": [(admin + "usage", {"group_by": "key_id", "limit": 200, **month},
                                 then_series("key_id", "day", month))],
        "caches (24 h)": [("/ui/api/runtime", {}), (admin + "usage", {"group_by": "cache_status", **day}),
                          (admin + "tenants", {})],
        "usage CSV (30 d, by tenant)": [("/ui/api/usage.csv", {"group": "tenant_id", "bucket": "day", **month})],
    }  # fmt: skip


def then_series(group: str, bucket: str, window: dict[str, str]) -> Callable[[httpx.Response], Call]:
    """The usage page's second call: the series of the first groups of its ranked totals (usage.js)."""

    def call(totals: httpx.Response) -> Call:
        groups = [row[group] for row in totals.json()["data"][:12]]
        return ("/ui/api/admin/usage/series", {"group": group, "bucket": bucket, "groups": groups, **window})

    return call


async def _call(client: httpx.AsyncClient, call: Call) -> list[httpx.Response]:
    """A call, then the call made from its answer (if any)."""
    path, params, *then = call
    answer = await client.get(path, params=params)
    return [answer, *(await _call(client, then[0](answer)) if then else [])]


async def time_pages(base: str, rounds: int) -> dict[str, dict[str, float]]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        assert (await client.post("/ui/api/session", json={"token": TOKEN})).status_code == 200
        results = {}
        for name, calls in pages().items():
            samples = []
            for _ in range(rounds + 1):
                started = time.perf_counter()
                answers = [
                    a for chain in await asyncio.gather(*(_call(client, c) for c in calls)) for a in chain
                ]
                samples.append((time.perf_counter() - started) * 1000)
                assert all(a.status_code == 200 for a in answers), [(a.url, a.status_code) for a in answers]
            kept = samples[1:]
            size = sum(len(a.content) for a in answers)
            results[name] = {"median_ms": statistics.median(kept), "max_ms": max(kept), "bytes": size}
    return results


def time_browser(base: str, rounds: int) -> dict[str, dict[str, float]]:
    from tests.ui_browser_support import chromium_or_skip

    driver = chromium_or_skip()
    results = {}
    try:
        driver.get(base + "/ui/")
        driver.find_element("css selector", "#token").send_keys(TOKEN + "\n")
        time.sleep(1)
        for page in ("overview", "tenants", "policies", "models", "usage", "caches"):
            samples = []
            for _ in range(rounds + 1):
                driver.get(base + "/ui/#/" + ("overview" if page != "overview" else "tenants"))
                time.sleep(0.3)
                started = time.perf_counter()
                driver.get(f"{base}/ui/#/{page}")
                while (
                    driver.execute_script(
                        f"const p = document.getElementById('page'); return p.dataset.page === '{page}' && p.dataset.ready === 'true'"
                    )
                    is not True
                ):
                    time.sleep(0.005)
                samples.append((time.perf_counter() - started) * 1000)
            results[page] = {"median_ms": statistics.median(samples[1:]), "max_ms": max(samples[1:])}
    finally:
        driver.quit()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--tenants", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument("--browser", action="store_true", help="also time Chromium drawing each page")
    args = parser.parse_args()
    url = asyncio.run(prepare(args.rows, args.keys, args.tenants, args.reseed))
    report: dict[str, Any] = {
        "rows": args.rows,
        "keys": args.keys,
        "tenants": args.tenants,
        "rounds": args.rounds,
    }
    with ServerThread(FakeUpstream()) as upstream:
        settings = Settings(database_url=url, admin_token=TOKEN, models=fake_models(upstream.url),
                            cache={"semantic_enabled": False})  # fmt: skip
        with ServerThread(create_app(settings)) as gateway:
            report["api"] = asyncio.run(time_pages(gateway.url, args.rounds))
            if args.browser:
                report["browser"] = time_browser(gateway.url, args.rounds)
    print(
        f"\n{args.rows:,} usage rows, {args.keys:,} keys, {args.tenants:,} tenants; PostgreSQL; median / worst of {args.rounds}"
    )
    print(f"{'page (its calls together)':34} {'median ms':>10} {'worst ms':>9} {'bytes':>10}")
    for name, row in report["api"].items():
        print(f"{name:34} {row['median_ms']:10.1f} {row['max_ms']:9.1f} {row['bytes']:10,}")
    for name, row in report.get("browser", {}).items():
        print(f"{'browser: ' + name:34} {row['median_ms']:10.1f} {row['max_ms']:9.1f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
