"""What admission adds to a request when the pool has room (issue 44: ≤ 0.2 ms p50, on and off in one run).

A fake instant upstream (tests/fakes.py FakeUpstream) behind three gateways started side by side, one alias
each: admission `off` (routing.admission.enabled=false), `on` with the deployment's `max_concurrency` set
far above the load (the gate's full path: the request is queued, the pump finds room and starts it, no
await), and `on-unknown` (no max_concurrency, no engine metrics: the pool's slots are unknown and the gate
lets the request through at once). A sequential client on one kept-alive connection measures the time to
the first SSE byte of a streamed chat completion (bench/gateway_overhead.py's `time_to_first_byte`); the
variants take turns, round after round, in a rotating order, so drifts of a shared box hit them alike.
Reported per variant: p50 and p90 over all rounds, the median of the per-round p50s, and p50 minus `off`'s.

    .venv/bin/python -m bench.admission_overhead [--rounds 12 --requests 250]
"""

import argparse
import statistics
import urllib.request
from typing import Any

from bench.gateway_overhead import chat_body, gateway_config, time_to_first_byte
from bench.lib.admission_pool import admission_series, slots_of
from bench.lib.harness import Process, start_fake_upstream, start_gateway, write_json

VARIANTS: dict[str, dict[str, Any]] = {
    "off": {"admission": {"enabled": False}, "max_concurrency": None},
    "on": {"admission": {"enabled": True}, "max_concurrency": 1_000_000},
    "on-unknown": {"admission": {"enabled": True}, "max_concurrency": None},
}


def variant_config(upstream: Process, variant: str) -> dict[str, Any]:
    config = gateway_config(upstream, "master")
    config["cache"] = {"enabled": False, "semantic_enabled": False}
    config["routing"] = {"admission": VARIANTS[variant]["admission"]}
    if VARIANTS[variant]["max_concurrency"]:
        config["models"][0]["deployments"][0]["max_concurrency"] = VARIANTS[variant]["max_concurrency"]
    return config


def measure(rounds: int, requests: int) -> dict[str, Any]:
    upstream = start_fake_upstream()
    gateways = {v: start_gateway(variant_config(upstream, v)) for v in VARIANTS}
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    per_round: dict[str, list[float]] = {v: [] for v in VARIANTS}
    body = chat_body("bench-model", stream=True)
    try:
        for gateway in gateways.values():  # warm-up: connections, first-use imports
            time_to_first_byte(gateway.port, "/v1/chat/completions", body, 50)
        names = list(VARIANTS)
        for index in range(rounds):
            for variant in names[index % len(names) :] + names[: index % len(names)]:
                got = time_to_first_byte(gateways[variant].port, "/v1/chat/completions", body, requests)
                samples[variant] += got
                per_round[variant].append(statistics.median(got))
        gates = {v: gate_figures(g) for v, g in gateways.items()}
    finally:
        for gateway in gateways.values():
            gateway.stop()
        upstream.stop()
    rows = {}
    for variant, values in samples.items():
        ordered = sorted(values)
        rows[variant] = {
            **gates[variant],
            "requests": len(values),
            "ttfb_p50_ms": ordered[len(ordered) // 2] * 1e3,
            "ttfb_p90_ms": ordered[int(len(ordered) * 0.9)] * 1e3,
            "median_of_round_p50s_ms": statistics.median(per_round[variant]) * 1e3,
        }
    for row in rows.values():
        row["added_p50_ms"] = row["ttfb_p50_ms"] - rows["off"]["ttfb_p50_ms"]
        row["added_round_p50_ms"] = row["median_of_round_p50s_ms"] - rows["off"]["median_of_round_p50s_ms"]
    return {"rounds": rounds, "requests_per_round": requests, "rows": rows}


def gate_figures(gateway: Process) -> dict[str, Any]:
    """Whether the gate saw the requests: the pool's slots it knew, how many it admitted and their waits."""
    with urllib.request.urlopen(gateway.url + "/metrics") as response:
        series = admission_series(response.read().decode())
    count = sum(v for k, v in series.items() if k.startswith("llmgw_admission_wait_seconds_count"))
    waited = sum(v for k, v in series.items() if k.startswith("llmgw_admission_wait_seconds_sum"))
    return {"gate_slots": slots_of(series), "gate_admitted": count, "gate_wait_s": waited}


def print_table(result: dict[str, Any]) -> None:
    print(f"\nadmission overhead, unsaturated (fake upstream, streamed TTFB, {result['rounds']} rounds × "
          f"{result['requests_per_round']} sequential requests per variant)")  # fmt: skip
    print(
        f"{'variant':<11} {'p50':>9} {'p90':>9} {'added p50':>10} {'round-p50 median':>17} {'added':>8}  gate"
    )
    for variant, r in result["rows"].items():
        print(f"{variant:<11} {r['ttfb_p50_ms']:>7.3f}ms {r['ttfb_p90_ms']:>7.3f}ms {r['added_p50_ms']:>8.3f}ms "
              f"{r['median_of_round_p50s_ms']:>15.3f}ms {r['added_round_p50_ms']:>6.3f}ms  slots {r['gate_slots']}, "
              f"admitted {r['gate_admitted']:.0f}, waited {r['gate_wait_s']:.3f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--requests", type=int, default=250)
    args = parser.parse_args()
    result = measure(args.rounds, args.requests)
    print_table(result)
    print(f"wrote {write_json('admission_overhead', result)}")


if __name__ == "__main__":
    main()
