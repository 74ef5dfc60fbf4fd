"""Cost of the rate-limit check: one admission (one Lua round trip to Redis) plus its settlement, for a
typical policy (key RPM+TPM, tenant RPM+TPM+concurrency, daily budget with a reservation).

Systems, alternated round by round, each at 1 and 16 concurrent callers:
- resp-handwritten: the gateway's limiter (policies/ratelimit/resp.py, pipelined RESP, hiredis reader);
- redis-py: the same scripts, keys and arguments through redis-py's asyncio client (hiredis parser);
- noop-script: a `return 1` script with the admission's keys and arguments (the cost of any script call);
- ping: a bare PING over the hand-written client (the round-trip floor);
- in-process: the in-process limiter.
CPU µs per request is this process's user+system time over the requests (the gateway-side cost);
the hand-written client is kept only while it saves more than 100 µs per request over redis-py.

    .venv/bin/python bench/policies_ratelimit.py [--requests 3000] [--rounds 3]
"""

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from redis.asyncio import Redis

from core.context import Principal
from policies.policy import Budget, Limits, Policy
from policies.ratelimit.local_limiter import LocalLimiter
from policies.ratelimit.plan import admission_buckets, spends
from policies.ratelimit.redis_limiter import _SCRIPTS, RedisLimiter
from policies.ratelimit.resp import LuaScript, RespPool

POLICY = Policy(
    key_limits=Limits(rpm=10**9, tpm=10**12),
    tenant_limits=Limits(rpm=10**9, tpm=10**12, max_concurrent=10**6),
    tenant_budget=Budget(usd_per_day=10**9),
)
PRINCIPAL = Principal("bench", "key_bench", "sk-gw-bench")
Request = Callable[[], Awaitable[object]]


def gateway_request(limiter: RedisLimiter | LocalLimiter) -> Request:
    now = datetime.now(UTC)
    buckets = admission_buckets(PRINCIPAL, POLICY, "m", 500, now, 0.001)

    async def one() -> None:
        member = uuid.uuid4().hex
        await limiter.admit(member, buckets)
        await limiter.settle(member, buckets, 400, spends(PRINCIPAL, 0.001, now))

    return one


def redis_py_request(client: Redis, shape: RedisLimiter) -> Request:
    """The same two script calls as the gateway's limiter, through redis-py (settlement awaited alike)."""
    admit = client.register_script((_SCRIPTS / "admit.lua").read_text())
    settle = client.register_script((_SCRIPTS / "settle.lua").read_text())
    now = datetime.now(UTC)
    buckets = admission_buckets(PRINCIPAL, POLICY, "m", 500, now, 0.001)

    async def one() -> None:
        member = uuid.uuid4().hex
        keys, args = shape.admission_call(member, buckets)
        await admit(keys=keys, args=args)
        keys, args = shape.settlement_call(member, buckets, 400, spends(PRINCIPAL, 0.001, now))
        await settle(keys=keys, args=args)

    return one


def noop_request(pool: RespPool, shape: RedisLimiter) -> Request:
    noop = LuaScript(pool, "return 1")
    buckets = admission_buckets(PRINCIPAL, POLICY, "m", 500, datetime.now(UTC), 0.001)

    async def one() -> None:
        keys, args = shape.admission_call(uuid.uuid4().hex, buckets)
        await noop(keys=keys, args=args)

    return one


async def measure(
    request: Request, requests: int, concurrency: int, drain: Callable[[], Awaitable[None]]
) -> dict:
    latencies: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            started = time.perf_counter()
            await request()
            latencies.append(time.perf_counter() - started)

    cpu = time.process_time()
    await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
    await drain()
    cpu_us = (time.process_time() - cpu) * 1e6 / len(latencies)
    ms = statistics.quantiles(latencies, n=100)
    return {"cpu_us_per_request": cpu_us, "p50_ms": ms[49] * 1000, "p99_ms": ms[98] * 1000}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    prefix = f"llmgw-bench:{uuid.uuid4().hex[:8]}:"
    pool = RespPool.from_url(args.redis_url, 5.0)
    limiter = RedisLimiter(pool, prefix, 60, 30)
    client = Redis.from_url(args.redis_url)
    systems: dict[str, tuple[Request, Callable[[], Awaitable[None]]]] = {
        "resp-handwritten": (gateway_request(limiter), limiter.drain),
        "redis-py": (redis_py_request(client, limiter), _nothing),
        "noop-script": (noop_request(pool, limiter), _nothing),
        "ping": (lambda: pool.call("PING"), _nothing),
        "in-process": (gateway_request(LocalLimiter(60, 30)), _nothing),
    }
    rows = [(name, c) for name in systems for c in (1, 16)]
    results: dict[str, list[dict]] = {f"{n}@{c}": [] for n, c in rows}
    for _ in range(args.rounds):
        for name, concurrency in rows:  # alternate the systems round by round
            request, drain = systems[name]
            results[f"{name}@{concurrency}"].append(await measure(request, args.requests, concurrency, drain))
    async for key in client.scan_iter(match=prefix + "*"):
        await client.delete(key)
    await client.aclose()
    await limiter.aclose()
    summary = {
        row: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for row, runs in results.items()
    }
    print(f"{'system@concurrency':<22} {'CPU µs/req':>11} {'p50 ms':>8} {'p99 ms':>8}"
          f"   (admit+settle, 6 buckets, median of {args.rounds} rounds × {args.requests})")  # fmt: skip
    for row, values in summary.items():
        print(
            f"{row:<22} {values['cpu_us_per_request']:>11.0f} {values['p50_ms']:>8.3f} {values['p99_ms']:>8.3f}"
        )
    saved = {c: summary[f"redis-py@{c}"]["cpu_us_per_request"] - summary[f"resp-handwritten@{c}"]["cpu_us_per_request"]
             for c in (1, 16)}  # fmt: skip
    print("hand-written client saves " + ", ".join(f"{v:.0f} µs/request at {c}" for c, v in saved.items()))
    out = Path(__file__).parent / "results" / "policies_ratelimit.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {"args": vars(args), "summary": summary, "saved_cpu_us": saved, "rounds": results}, indent=2
        )
    )


async def _nothing() -> None:
    return None


if __name__ == "__main__":
    asyncio.run(main())
