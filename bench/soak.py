"""Soak: a gateway under steady load for a long time; its memory must not grow, its file descriptors stay flat.

Starts real processes (tests/chaos/processes.py): its own PostgreSQL cluster (run as root: initdb runs
as the postgres user), its own redis-server, the fake upstream and one gateway replica. A virtual key whose policy has
RPM/TPM limits (checked in Redis; `--policy none`: no limits) sends a mix of plain and streamed chat requests from `--concurrency`
closed-loop clients. After a warm-up, the gateway's RSS and open file descriptors are sampled; at the
end the gateway gets SIGTERM and the usage rows are counted against the successful answers.

Pass: RSS growth < 5 % (median of the last three samples over the median of the first three), file
descriptors flat (last - first <= 8: connection pools breathe a little), no 5xx, rows = answers.

    .venv/bin/python bench/soak.py [--duration 1800] [--concurrency 8] [--sample-every 15]
"""

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.lib.harness import write_json  # noqa: E402
from policies.policy import Policy  # noqa: E402
from tests.chaos.database import new_schema, provision, usage_rows  # noqa: E402
from tests.chaos.load import chat, send  # noqa: E402
from tests.chaos.processes import (  # noqa: E402
    Gateway,
    PostgresCluster,
    Upstream,
    chaos_redis,
    deployment,
    gateway_env,
)

RSS_GROWTH_LIMIT = 0.05
FD_SLACK = 8
POLICIES = {"limits": Policy(key_limits={"rpm": 10_000_000, "tpm": 1_000_000_000}), "none": Policy()}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Tally:
    """Outcomes without keeping them: counts by status, complete answers, a latency sample."""

    def __init__(self) -> None:
        self.statuses: Counter[int] = Counter()
        self.complete = 0
        self.latencies: list[float] = []

    def add(self, outcome: Any) -> None:
        self.statuses[outcome.status] += 1
        self.complete += outcome.complete
        if len(self.latencies) < 200_000:
            self.latencies.append(outcome.latency_s)

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


async def load(url: str, secret: str, concurrency: int, stop: asyncio.Event, tally: Tally) -> None:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def client_loop(worker: int) -> None:
            i = worker
            while not stop.is_set():
                body = chat(f"soak {i} " + "word " * (i % 40), stream=i % 4 == 0)
                tally.add(await send(client, url, secret, body))
                i += concurrency

        await asyncio.gather(*(client_loop(w) for w in range(concurrency)))


async def soak(args: argparse.Namespace, gateway: Gateway, secret: str) -> tuple[list[dict], Tally]:
    tally, stop = Tally(), asyncio.Event()
    runner = asyncio.create_task(load(gateway.url, secret, args.concurrency, stop, tally))
    await asyncio.sleep(args.warmup)
    samples: list[dict] = []
    started, last_total = time.monotonic(), tally.total
    print(f"{'t (s)':>7} {'requests':>9} {'req/s':>7} {'RSS MiB':>8} {'fds':>5} {'non-200':>8}")
    while True:
        now = time.monotonic() - started
        total = tally.total
        rate = (total - last_total) / args.sample_every if samples else 0.0
        sample = {"t_s": round(now, 1), "requests": total, "rps": round(rate, 1),
                  "rss_mib": round(rss_mib(gateway.pid()), 1), "fds": open_fds(gateway.pid()),
                  "non_200": total - tally.statuses[200]}  # fmt: skip
        samples.append(sample)
        print(f"{sample['t_s']:>7} {total:>9} {rate:>7.1f} {sample['rss_mib']:>8} {sample['fds']:>5} "
              f"{sample['non_200']:>8}", flush=True)  # fmt: skip
        if now >= args.duration:
            break
        last_total = total
        await asyncio.sleep(min(args.sample_every, max(0.0, args.duration - now)))
    stop.set()
    await runner
    return samples, tally


def verdict(samples: list[dict], tally: Tally, rows: dict[int, int]) -> dict[str, Any]:
    first = statistics.median(s["rss_mib"] for s in samples[:3])
    last = statistics.median(s["rss_mib"] for s in samples[-3:])
    growth = (last - first) / first
    fd_change = samples[-1]["fds"] - samples[0]["fds"]
    server_errors = sum(n for status, n in tally.statuses.items() if status >= 500 or status == 0)
    latencies = sorted(tally.latencies)
    return {
        "requests": tally.total,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 1) if latencies else None,
        "rss_first_mib": first,
        "rss_last_mib": last,
        "rss_growth": round(growth, 4),
        "fds_first": samples[0]["fds"],
        "fds_last": samples[-1]["fds"],
        "fds_max": max(s["fds"] for s in samples),
        "usage_rows": sum(rows.values()),
        "usage_rows_200": rows.get(200, 0),
        "complete_answers": tally.complete,
        "pass": {
            "rss_growth_below_5pct": growth < RSS_GROWTH_LIMIT,
            "fds_flat": fd_change <= FD_SLACK,
            "no_server_errors": server_errors == 0,
            "rows_equal_answers": rows.get(200, 0) == tally.complete and sum(rows.values()) == tally.total,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of measured load")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds of load before the first sample")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--sample-every", type=float, default=15.0)
    parser.add_argument("--policy", choices=sorted(POLICIES), default="limits",
                        help="the key's policy: RPM/TPM limits checked in Redis (default), or none")  # fmt: skip
    args = parser.parse_args()

    reason = PostgresCluster.available()
    if reason:
        sys.exit(f"the soak runs its own PostgreSQL cluster: {reason}")
    postgres = PostgresCluster().init()
    redis, upstream, gateway = chaos_redis(), Upstream().start(), None
    try:
        schema = new_schema(postgres)
        key = asyncio.run(provision(postgres.url, schema, {"soak": POLICIES[args.policy]}))["soak"]
        models = [{"name": "m", "deployments": [deployment("fake-1", upstream)]}]
        gateway = Gateway(gateway_env(postgres.url, schema, models, redis.url)).spawn().wait_ready()
        samples, tally = asyncio.run(soak(args, gateway, key.secret))
        exit_code = gateway.terminate(120)
        rows = asyncio.run(usage_rows(postgres, schema, key.key_id))
    finally:
        if gateway:
            gateway.kill()
        upstream.stop()
        redis.stop()
        postgres.destroy()
    extra = {"exit_code": exit_code, "args": vars(args), "load_average": os.getloadavg(), "samples": samples}
    result = verdict(samples, tally, rows) | extra
    print({k: v for k, v in result.items() if k != "samples"})
    print("written:", write_json("soak", result))
    sys.exit(0 if all(result["pass"].values()) else 1)


if __name__ == "__main__":
    main()
