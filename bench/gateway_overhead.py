"""Gateway overhead: the same load straight at a fake instant upstream and through the gateway.

Load: wrk (one thread, closed loop) at 1, 16 and 64 connections; direct and gateway runs alternate.
Gateway CPU per request comes from the gateway process's user+system time over the requests it served.
Streaming: a raw-socket client measures time to the first SSE byte, direct vs through the gateway.
Modes (each its own gateway process): `master` (master key, in-process stores), `no-metrics` (the same
with metrics and access log off: the observability cost), `virtual-key` (a virtual key whose policy
has RPM/TPM/concurrency limits checked in Redis, usage records written to the database). `vk-plain`,
`vk-tls` and `vk-cluster` are that virtual key on the three Redis deployments operators run (issue 41),
started here on loopback (tests/redis_deploy_servers.py): a plain server, `rediss://` with an ACL user and
a 3-node Redis Cluster; the exact cache is off in these three (it refuses a Cluster), so they differ only in
the limiter's Redis. Run them with one tree (`--trees .`) to load them in turn, round by round:

    PYTHONPATH=. .venv/bin/python bench/gateway_overhead.py --trees . --modes vk-plain vk-tls vk-cluster \
        --rounds 9 --name gateway_overhead_redis

    .venv/bin/python bench/gateway_overhead.py [--seconds 5] [--rounds 3] [--modes master virtual-key]

Before vs after (`--trees`): gateways from two source trees (e.g. `git worktree add /tmp/before main`), each
imported from its tree; on a shared, busy box one run after the other measures the load as much as the code, so
each round loads every gateway in turn and the median over rounds is reported (gateway CPU per request, rps;
no direct runs). Writes bench/results/gateway_overhead_ab.json.

    PYTHONPATH=. .venv/bin/python bench/gateway_overhead.py --trees /tmp/before . --rounds 7
"""

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.lib.harness import Process, start_fake_upstream, start_gateway, write_json, wrk  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from policies.policy import Limits, Policy  # noqa: E402
from policies.provision import provision_virtual_key  # noqa: E402
from tests.redis_deploy_servers import (  # noqa: E402
    ACL_PASSWORD,
    ACL_USER,
    make_certificates,
    redis_cluster,
    tls_acl_redis,
)

KEY = "sk-bench-master"
REDIS_URL = "redis://127.0.0.1:6379/0"
# the limiter's Redis per mode: URL and LLMGW_POLICIES__REDIS options (vk-tls and vk-cluster: set by redis_servers)
REDIS: dict[str, tuple[str, dict[str, Any]]] = {"virtual-key": (REDIS_URL, {}), "vk-plain": (REDIS_URL, {})}


def chat_body(model: str, stream: bool = False) -> bytes:
    return orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    )


def gateway_config(upstream: Process, mode: str) -> dict[str, Any]:
    deployment = {"name": "fake", "base_url": upstream.url + "/v1", "model": "upstream-model"}
    database = f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='llmgw-bench-')}/llmgw.db"
    models = [{"name": "bench-model", "deployments": [deployment]}]
    config: dict[str, Any] = {"master_key": KEY, "models": models, "database_url": database}
    config["cache"] = {"semantic_enabled": False}  # measures the proxy path; see bench/cache_latency.py
    if mode == "no-metrics":
        config["observability"] = {"metrics_enabled": False, "access_log": False}
    if mode in REDIS:
        url, options = REDIS[mode]
        config["redis_url"] = url
        # 1 s, not the 50 ms default: on a busy 2-core box a starved process misses 50 ms, and the limiter
        # would fail over to local limits and replay, which is not the path measured here
        config["policies"] = {"redis_prefix": f"llmgw-bench-{time.time_ns()}:", "redis_timeout_s": 1.0,
                              "redis": options}  # fmt: skip
        if mode != "virtual-key":
            config["cache"] = {"enabled": False}
    return config


@contextlib.contextmanager
def redis_servers(modes: list[str]) -> Any:
    """Start the TLS+ACL server and the cluster that `modes` ask for, and point REDIS at them."""
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-redis-"))
        if "vk-tls" in modes:
            certs = make_certificates(workdir)
            tls = stack.enter_context(tls_acl_redis(workdir, certs))
            url = f"rediss://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{tls.port}/0"
            REDIS["vk-tls"] = (url, {"tls_ca_file": str(certs.ca)})
        if "vk-cluster" in modes:
            nodes = stack.enter_context(redis_cluster(workdir))
            REDIS["vk-cluster"] = (f"redis://127.0.0.1:{nodes[0].port}", {"cluster": True})
        yield


def start_mode(upstream: Process, mode: str) -> tuple[Process, str]:
    """A gateway for `mode`, and the bearer key to load it with."""
    config = gateway_config(upstream, mode)
    key = KEY
    if mode in REDIS:
        unlimited = Limits(rpm=10**9, tpm=10**12, max_concurrent=10**6)
        policy = Policy(key_limits=unlimited, tenant_limits=unlimited)
        key = asyncio.run(provision_virtual_key(Settings(**config), "bench", policy))
    return start_gateway(config), key


def load_round(
    upstream: Process, gateway: Process, key: str, connections: int, seconds: float
) -> dict[str, Any]:
    direct = wrk(
        upstream.url + "/v1/chat/completions", chat_body("upstream-model"), KEY, connections, seconds
    )
    cpu_before = gateway.cpu_seconds()
    through = wrk(gateway.url + "/v1/chat/completions", chat_body("bench-model"), key, connections, seconds)
    cpu_us = (gateway.cpu_seconds() - cpu_before) * 1e6 / max(through["requests"], 1)
    return {"direct": direct, "gateway": through, "gateway_cpu_us_per_request": cpu_us}


def summarise(connections: int, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def median(side: str, key: str) -> float:
        return statistics.median(r[side][key] for r in rounds)

    def rps(side: str) -> float:
        return statistics.median(r[side]["requests"] / (r[side]["duration_us"] / 1e6) for r in rounds)

    return {
        "connections": connections,
        "direct_rps": rps("direct"),
        "gateway_rps": rps("gateway"),
        "direct_p50_ms": median("direct", "p50_us") / 1e3,
        "gateway_p50_ms": median("gateway", "p50_us") / 1e3,
        "direct_p99_ms": median("direct", "p99_us") / 1e3,
        "gateway_p99_ms": median("gateway", "p99_us") / 1e3,
        "added_p50_ms": (median("gateway", "p50_us") - median("direct", "p50_us")) / 1e3,
        "gateway_cpu_us_per_request": statistics.median(r["gateway_cpu_us_per_request"] for r in rounds),
        "errors": sum(r["gateway"]["errors"] + r["gateway"]["non2xx"] for r in rounds),
    }


def time_to_first_byte(port: int, path: str, body: bytes, count: int) -> list[float]:
    request = (
        f"POST {path} HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    samples = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            samples.append(_one_stream(sock, request))
    return samples


def _one_stream(sock: socket.socket, request: bytes) -> float:
    start = time.perf_counter()
    sock.sendall(request)
    seen = b""
    first = 0.0
    while b"data: [DONE]" not in seen:
        seen += sock.recv(65536)
        if not first and b"data:" in seen:
            first = time.perf_counter() - start
    return first


def streaming_ttfb(upstream: Process, gateway: Process, rounds: int) -> dict[str, float]:
    direct, through = [], []
    for _ in range(rounds * 2):
        direct += time_to_first_byte(
            upstream.port, "/v1/chat/completions", chat_body("upstream-model", True), 100
        )
        through += time_to_first_byte(
            gateway.port, "/v1/chat/completions", chat_body("bench-model", True), 100
        )
    direct_ms, through_ms = statistics.median(direct) * 1e3, statistics.median(through) * 1e3
    return {
        "direct_ttfb_p50_ms": direct_ms,
        "gateway_ttfb_p50_ms": through_ms,
        "added_ttfb_p50_ms": through_ms - direct_ms,
    }


def print_table(rows: list[dict[str, Any]], streaming: dict[str, float] | None) -> None:
    print(f"{'mode':>11} {'conns':>5} {'direct rps':>10} {'gw rps':>8} {'direct p50':>10} {'gw p50':>8} "
          f"{'added p50':>9} {'gw p99':>8} {'gw CPU/req':>10} {'errors':>6}")  # fmt: skip
    for r in rows:
        print(f"{r['mode']:>11} {r['connections']:>5} {r['direct_rps']:>10.0f} {r['gateway_rps']:>8.0f} "
              f"{r['direct_p50_ms']:>8.3f}ms {r['gateway_p50_ms']:>6.3f}ms {r['added_p50_ms']:>7.3f}ms "
              f"{r['gateway_p99_ms']:>6.2f}ms {r['gateway_cpu_us_per_request']:>8.0f}µs {r['errors']:>6}")  # fmt: skip
    if streaming:
        print(f"streaming TTFB p50 (master): direct {streaming['direct_ttfb_p50_ms']:.3f} ms, gateway "
              f"{streaming['gateway_ttfb_p50_ms']:.3f} ms, added {streaming['added_ttfb_p50_ms']:.3f} ms")  # fmt: skip


def run_mode(upstream: Process, mode: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], Any]:
    gateway, key = start_mode(upstream, mode)
    try:
        wrk(gateway.url + "/v1/chat/completions", chat_body("bench-model"), key, 4, 1)  # warm-up
        rounds = {c: [load_round(upstream, gateway, key, c, args.seconds) for _ in range(args.rounds)]
                  for c in args.connections}  # fmt: skip
        streaming = streaming_ttfb(upstream, gateway, args.rounds) if mode == "master" else None
    finally:
        gateway.stop()
    return [{"mode": mode, **summarise(c, r)} for c, r in rounds.items()], streaming


def compare_trees(args: argparse.Namespace) -> None:
    """`--trees BEFORE AFTER`: every tree's gateway per mode, loaded in turn each round (see the docstring)."""
    trees = [str(Path(tree).resolve()) for tree in args.trees]
    os.chdir("/")  # `python -m gateway.cli` must import the tree on PYTHONPATH, not the current directory
    upstream = start_fake_upstream()
    gateways: dict[tuple[str, str], tuple[Process, str]] = {}
    samples: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    try:
        for tree in trees:
            for mode in args.modes:
                os.environ["PYTHONPATH"] = tree
                gateways[(tree, mode)] = start_mode(upstream, mode)
        for gateway, key in gateways.values():
            wrk(gateway.url + "/v1/chat/completions", chat_body("bench-model"), key, 4, 1)  # warm-up
        for _ in range(args.rounds):
            for connections in args.connections:
                for (tree, mode), (gateway, key) in gateways.items():
                    before = gateway.cpu_seconds()
                    out = wrk(gateway.url + "/v1/chat/completions", chat_body("bench-model"), key, connections,
                              args.seconds)  # fmt: skip
                    cpu_us = (gateway.cpu_seconds() - before) * 1e6 / max(out["requests"], 1)
                    run = {"cpu_us": cpu_us, "rps": out["requests"] / args.seconds,
                           "errors": out["errors"] + out["non2xx"]}  # fmt: skip
                    samples.setdefault((tree, mode, connections), []).append(run)
    finally:
        for gateway, _ in gateways.values():
            gateway.stop()
        upstream.stop()
    rows: list[dict[str, Any]] = []
    for (tree, mode, connections), runs in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        cpu = statistics.median(r["cpu_us"] for r in runs)
        rps = statistics.median(r["rps"] for r in runs)
        errors = sum(r["errors"] for r in runs)
        rows.append({"tree": tree, "mode": mode, "connections": connections, "cpu_us_per_request": cpu,
                     "rps": rps, "errors": errors, "cpu_us_runs": [round(r["cpu_us"]) for r in runs]})  # fmt: skip
        print(
            f"{mode:>11} {connections:>3} conns  {tree:<24} CPU/request {cpu:6.0f} µs  rps {rps:6.0f}  errors {errors}"
        )
    payload = {"load_generator": "wrk -t1", "rows": rows}
    print(f"wrote {write_json(args.name or 'gateway_overhead_ab', payload)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--trees", nargs="+", metavar="TREE", help="compare source trees (one: modes in turn)"
    )
    parser.add_argument("--name", default=None, help="results file (default gateway_overhead[_ab])")
    parser.add_argument("--seconds", type=float, help="per load run (default 5; 2 with --trees)")
    parser.add_argument("--rounds", type=int, help="default 3; 7 with --trees")
    parser.add_argument("--connections", type=int, nargs="+", help="default 1 16 64; 1 16 with --trees")
    parser.add_argument(
        "--modes", nargs="+", help="default master no-metrics virtual-key; master virtual-key with --trees"
    )
    args = parser.parse_args()
    defaults = (
        (2.0, 7, [1, 16], ["master", "virtual-key"])
        if args.trees
        else (5.0, 3, [1, 16, 64], ["master", "no-metrics", "virtual-key"])
    )
    for name, default in zip(("seconds", "rounds", "connections", "modes"), defaults, strict=True):
        setattr(args, name, default if getattr(args, name) is None else getattr(args, name))
    with redis_servers(args.modes):
        if args.trees:
            compare_trees(args)
        else:
            measure_modes(args)


def measure_modes(args: argparse.Namespace) -> None:
    upstream = start_fake_upstream()
    rows, streaming = [], None
    try:
        for mode in args.modes:
            mode_rows, mode_streaming = run_mode(upstream, mode, args)
            rows += mode_rows
            streaming = streaming or mode_streaming
    finally:
        upstream.stop()
    print_table(rows, streaming)
    payload = {"load_generator": "wrk -t1", "rows": rows, "streaming": streaming}
    print(f"wrote {write_json(args.name or 'gateway_overhead', payload)}")


if __name__ == "__main__":
    main()
