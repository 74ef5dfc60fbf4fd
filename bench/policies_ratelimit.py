"""Latency of the rate-limit check itself: one admission (one Lua round trip to Redis) and the
settlement, for a typical policy (key RPM+TPM, tenant RPM+TPM+concurrency, daily budget), against
the in-process limiter, a bare PING (the round-trip floor) and a no-op script called with the
same keys and arguments (the cost of any script call: admit minus it is the Lua work). Runs alternate between the systems; prints a table, writes JSON.

    .venv/bin/python bench/policies_ratelimit.py [--requests 5000] [--rounds 3]
"""

import argparse
import asyncio
import json
import statistics
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from gateway.context import Principal
from policies.config import PoliciesSettings
from policies.policy import Budget, Limits, Policy
from policies.ratelimit.local_limiter import LocalLimiter
from policies.ratelimit.plan import admission_buckets, spends
from policies.ratelimit.redis_limiter import RedisLimiter
from policies.service import limits_client

POLICY = Policy(
    key_limits=Limits(rpm=10**9, tpm=10**12),
    tenant_limits=Limits(rpm=10**9, tpm=10**12, max_concurrent=10**6),
    tenant_budget=Budget(usd_per_day=10**9),
)


async def measure(limiter, requests: int) -> dict[str, float]:
    principal = Principal("bench", "key_bench", "sk-gw-bench")
    now = datetime.now(UTC)
    buckets = admission_buckets(principal, POLICY, "m", 500, now)
    admit, settle = [], []
    for _ in range(requests):
        member = uuid.uuid4().hex
        started = time.perf_counter()
        await limiter.admit(member, buckets)
        admitted = time.perf_counter()
        await limiter.settle(member, buckets, 400, spends(principal, 0.001, now))
        admit.append(admitted - started)
        settle.append(time.perf_counter() - admitted)
    return {
        "admit_p50_ms": _pct(admit, 50),
        "admit_p99_ms": _pct(admit, 99),
        "settle_p50_ms": _pct(settle, 50),
    }


def _pct(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100)[pct - 1] * 1000 if pct < 100 else max(values) * 1000


async def ping_floor(client, requests: int) -> dict[str, float]:
    """The client↔Redis round trip with no work: the floor under any Redis-backed check."""
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        await client.ping()
        times.append(time.perf_counter() - started)
    return {"admit_p50_ms": _pct(times, 50), "admit_p99_ms": _pct(times, 99), "settle_p50_ms": 0.0}


class NoopScript:
    """EVALSHA of `return 1` with the admission's keys and arguments: the cost of any script call."""

    def __init__(self, limiter: RedisLimiter, client) -> None:
        self._limiter = limiter
        self._noop = client.register_script("return 1")

    async def admit(self, member, buckets):
        keys, args = self._limiter.admission_call(member, buckets)
        await self._noop(keys=keys, args=args)

    async def settle(self, member, buckets, tokens, spends):
        return None


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    prefix = f"llmgw-bench:{uuid.uuid4().hex[:8]}:"
    client = limits_client(args.redis_url, PoliciesSettings())
    redis_limiter = RedisLimiter(client, prefix, 60, 900)
    systems = {
        "redis-lua": redis_limiter,
        "noop-script": NoopScript(RedisLimiter(client, prefix, 60, 900), client),
        "in-process": LocalLimiter(60, 900),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in [*systems, "redis-ping"]}
    for _ in range(args.rounds):
        for name, limiter in systems.items():  # alternate the systems round by round
            results[name].append(await measure(limiter, args.requests))
        results["redis-ping"].append(await ping_floor(client, args.requests))
    async for key in client.scan_iter(match=prefix + "*"):
        await client.delete(key)
    await client.aclose()
    summary = {
        name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()
    }
    print(
        f"{'limiter':<12} {'admit p50 ms':>13} {'admit p99 ms':>13} {'settle p50 ms':>14}   (6 buckets, median of {args.rounds} rounds × {args.requests})"
    )
    for name, row in summary.items():
        print(
            f"{name:<12} {row['admit_p50_ms']:>13.3f} {row['admit_p99_ms']:>13.3f} {row['settle_p50_ms']:>14.3f}"
        )
    out = Path(__file__).parent / "results" / "policies_ratelimit.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {"args": vars(args), "summary": summary, "rounds": results},
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
