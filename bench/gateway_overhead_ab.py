"""Gateway CPU per request, before vs after: gateways from two source trees, wrk runs interleaved.

On a shared, busy box one run after the other measures the load as much as the code; here each round
loads every gateway in turn, so both trees see the same load, and the median over rounds is reported.
A tree is a checkout (e.g. `git worktree add /tmp/before main`); its gateway is imported from it.

    PYTHONPATH=. .venv/bin/python bench/gateway_overhead_ab.py /tmp/before . --rounds 7
"""

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gateway_overhead import chat_body, start_mode  # noqa: E402
from bench.harness import Process, start_fake_upstream, write_json, wrk  # noqa: E402


def measure(gateway: Process, key: str, connections: int, seconds: float) -> dict[str, float]:
    before = gateway.cpu_seconds()
    out = wrk(gateway.url + "/v1/chat/completions", chat_body("bench-model"), key, connections, seconds)
    cpu_us = (gateway.cpu_seconds() - before) * 1e6 / max(out["requests"], 1)
    return {"cpu_us": cpu_us, "rps": out["requests"] / seconds, "errors": out["errors"] + out["non2xx"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", nargs=2, help="source trees: before, after")
    parser.add_argument("--modes", nargs="+", default=["master", "virtual-key"])
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    args.trees = [str(Path(tree).resolve()) for tree in args.trees]
    os.chdir("/")  # `python -m gateway.cli` must import the tree on PYTHONPATH, not the current directory
    upstream = start_fake_upstream()
    gateways: dict[tuple[str, str], tuple[Process, str]] = {}
    samples: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    try:
        for tree in args.trees:
            for mode in args.modes:
                os.environ["PYTHONPATH"] = tree
                gateways[(tree, mode)] = start_mode(upstream, mode)
        for gateway, key in gateways.values():
            wrk(gateway.url + "/v1/chat/completions", chat_body("bench-model"), key, 4, 1)  # warm-up
        for _ in range(args.rounds):
            for connections in args.connections:
                for (tree, mode), (gateway, key) in gateways.items():
                    run = measure(gateway, key, connections, args.seconds)
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
    print(f"wrote {write_json('gateway_overhead_ab', {'load_generator': 'wrk -t1', 'rows': rows})}")


if __name__ == "__main__":
    main()
