"""Gateway instructions per request under valgrind's callgrind: a load-independent A/B of CPU cost.

CPU seconds per request move with the box's load (cache and frequency contention, steal); instruction
counts do not. Each tree's gateway runs under `valgrind --tool=callgrind`; a client sends warm-up
requests, the counters are zeroed (`callgrind_control -z`), then exactly `--requests` requests are sent
over 1 and over 16 keep-alive connections, and the dump's total instructions (all of the gateway's
threads) are divided by the request count. The fake upstream and the client run outside valgrind.

    PYTHONPATH=. .venv/bin/python bench/gateway_callgrind.py /tmp/before . [--requests 600]

The limiter's Redis as operators run it (issue 41: plain, `rediss://` with an ACL user, a 3-node Cluster; the
modes of bench/gateway_overhead.py, TLS's crypto counted with the rest of the process):

    PYTHONPATH=. .venv/bin/python bench/gateway_callgrind.py . --modes vk-plain vk-tls vk-cluster \
        --name gateway_callgrind_redis
"""

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gateway_overhead import KEY, REDIS, chat_body, gateway_config, redis_servers  # noqa: E402
from bench.lib.harness import Process, free_port, start_fake_upstream, wait_for_port, write_json  # noqa: E402


def request_bytes(key: str) -> bytes:
    body = chat_body("bench-model")
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _one_connection(port: int, request: bytes, count: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(count):
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
        await reader.readexactly(length)
    writer.close()


def send(port: int, key: str, connections: int, total: int) -> None:
    request = request_bytes(key)

    async def run() -> None:
        await asyncio.gather(
            *(_one_connection(port, request, total // connections) for _ in range(connections))
        )

    asyncio.run(run())


def start_under_callgrind(tree: str, config: dict[str, Any], out: Path) -> Process:
    port = free_port()
    path = Path(tempfile.mkstemp(suffix=".yaml")[1])
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": tree, "LLMGW_CONFIG_FILE": str(path), "LLMGW_LOG_LEVEL": "warning"}
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
               sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]  # fmt: skip
    popen = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
    wait_for_port(port, timeout=600)
    return Process(popen, port)


def total_instructions(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


def measure(gateway: Process, key: str, connections: int, requests: int, out: Path) -> float:
    pid = str(gateway.popen.pid)
    subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
    send(gateway.port, key, connections, requests)
    before = set(out.parent.glob(out.name + "*"))
    subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
    dump = max(set(out.parent.glob(out.name + "*")) - before or before, key=lambda p: p.stat().st_mtime)
    return total_instructions(dump) / (requests // connections * connections)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", nargs="+", help="source trees, e.g. before and after")
    modes = ["master", "virtual-key", "vk-plain", "vk-tls", "vk-cluster"]
    parser.add_argument("--modes", nargs="+", default=["virtual-key"], choices=modes)
    parser.add_argument("--name", default="gateway_callgrind", help="results file under bench/results")
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, default=640)
    args = parser.parse_args()

    upstream = start_fake_upstream()
    rows = []
    work = Path(tempfile.mkdtemp(prefix="llmgw-callgrind-"))
    runs = [(tree, mode) for tree in (Path(t).resolve() for t in args.trees) for mode in args.modes]
    try:
        with redis_servers(args.modes):
            for index, (tree, mode) in enumerate(runs):
                rows += measure_run(args, upstream, tree, mode, work / f"callgrind.{index}.out")
    finally:
        upstream.stop()
    print(f"wrote {write_json(args.name, {'requests': args.requests, 'rows': rows})}")


def measure_run(args: argparse.Namespace, upstream: Process, tree: Path, mode: str, out: Path) -> list[dict]:
    """One tree's gateway in one mode under callgrind: instructions per request at each connection count."""
    from gateway.settings import Settings
    from policies.policy import Limits, Policy
    from policies.provision import provision_virtual_key

    rows = []
    config, key = gateway_config(upstream, mode), KEY
    if mode in REDIS:
        unlimited = Limits(rpm=10**9, tpm=10**12, max_concurrent=10**6)
        policy = Policy(key_limits=unlimited, tenant_limits=unlimited)
        key = asyncio.run(provision_virtual_key(Settings(**config), "bench", policy))
    gateway = start_under_callgrind(str(tree), config, out)
    try:
        send(gateway.port, key, 4, 200)  # warm-up: connections, caches, lazily built state
        for connections in args.connections:
            per_request = measure(gateway, key, connections, args.requests, out)
            rows.append({"tree": str(tree), "mode": mode, "connections": connections,
                         "instructions_per_request": round(per_request)})  # fmt: skip
            print(f"{mode:>11} {connections:>3} conns  {str(tree):<24} "
                  f"{per_request / 1e6:7.2f} M instructions/request", flush=True)  # fmt: skip
    finally:
        gateway.popen.terminate()
        try:
            gateway.popen.wait(timeout=120)
        except subprocess.TimeoutExpired:  # a slow drain under valgrind: its dumps are read already
            gateway.popen.kill()
            gateway.popen.wait()
    return rows


if __name__ == "__main__":
    main()
