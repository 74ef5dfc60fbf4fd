"""What a semantic lookup (encode, search, verify) adds to a cache miss, measured through the gateway's
HTTP API from the client side, and whether it slows requests that skip the semantic cache.

One gateway (default cache settings: semantic on, ONNX Runtime encoder, shipped verifier) in front of
the fake upstream. The cache is first filled with `--fill` questions; then, interleaved one by one:
  semantic miss — temperature 0, a new look-alike question: embedded, searched, candidates verified,
                  rejected, sent upstream (rows whose status was a hit are counted, not timed);
  bypass        — the same question at temperature 0.7: the cache stays out (no embedding).
The difference of the two p50s (and p99s) is the semantic lookup's cost on a miss. Then the bypass p50
alone, beside another client sending bypass requests back to back (any concurrent traffic on 2 cores), and
beside one sending semantic misses (what embedding and verifying add to that).

    python -m bench.cache_latency [--requests 300] [--fill 500] [--name NAME]
Writes bench/results/cache_latency.json (cache_latency_NAME.json with --name).
"""

import argparse
import os
import statistics
import threading
import time
from typing import Any

import httpx

from bench.lib.cache_gateway import KEY, body, config
from bench.lib.harness import start_fake_upstream, start_gateway, write_json
from bench.lib.verifier_templates import INTENTS, SLOTS


def questions() -> tuple[list[str], list[str]]:
    """Template questions, split by slot value: the stored ones and look-alikes about other values (their
    nearest stored neighbours ask the same of another entity, so the verifier has candidates to reject)."""
    stored, asked = [], []
    for slot, intents in INTENTS.values():
        for n, value in enumerate(SLOTS[slot]):
            for phrasings in intents.values():
                (stored if n % 2 == 0 else asked).extend(p.format(x=value) for p in phrasings)
    return stored, asked


def sample(stored: list[str], asked: list[str], fill: int, requests: int) -> tuple[list[str], list[str]]:
    """`fill` stored questions and `requests` look-alikes, spread evenly over the templates."""
    return (
        stored[:: max(1, len(stored) // fill)][:fill],
        asked[:: max(1, len(asked) // requests)][:requests],
    )


def timed(client: httpx.Client, question: str, temperature: float) -> tuple[float, str]:
    start = time.perf_counter()
    reply = client.post("/v1/chat/completions", json=body(question, temperature))
    elapsed = time.perf_counter() - start
    reply.raise_for_status()
    return elapsed, reply.headers.get("x-cache-status", "")


def percentiles(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
        "n": len(ms),
    }


def interleaved(client: httpx.Client, asked: list[str]) -> dict[str, Any]:
    semantic, bypass, hits = [], [], 0
    for question in asked:
        elapsed, status = timed(client, question, 0)
        if status == "miss":
            semantic.append(elapsed)
        else:
            hits += 1
        bypass.append(timed(client, question, 0.7)[0])
    s, b = percentiles(semantic), percentiles(bypass)
    return {"semantic_miss": s, "bypass": b, "semantic_hits_not_timed": hits,
            "added_p50_ms": s["p50_ms"] - b["p50_ms"], "added_p99_ms": s["p99_ms"] - b["p99_ms"]}  # fmt: skip


def beside(url: str, asked: list[str]) -> dict[str, Any]:
    """Bypass p50 alone, then while another client keeps sending requests back to back: bypass requests
    (what any concurrent traffic costs on 2 cores), then semantic lookups (what embedding and verifying
    add on top)."""
    report: dict[str, Any] = {}
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {KEY}"}, timeout=60) as client:
        report["bypass_alone"] = percentiles([timed(client, q, 0.7)[0] for q in asked])
        for name, temperature in (("bypass", 0.7), ("semantic", 0.0)):
            stop = threading.Event()

            def load(temperature: float = temperature, stop: threading.Event = stop) -> None:
                with httpx.Client(
                    base_url=url, headers={"authorization": f"Bearer {KEY}"}, timeout=60
                ) as other:
                    i = 0
                    while not stop.is_set():
                        timed(other, f"{asked[i % len(asked)]} (variant {i})", temperature)
                        i += 1

            thread = threading.Thread(target=load, daemon=True)
            thread.start()
            time.sleep(0.5)
            report[f"bypass_beside_{name}"] = percentiles([timed(client, q, 0.7)[0] for q in asked])
            stop.set()
            thread.join(timeout=60)
    return report


def components(asked: list[str], stored: list[str]) -> dict[str, Any]:
    """In-process: one question's encoding (ONNX Runtime, 1 thread) and one verifier judgement."""
    from bench.lib.verifier_pairs import shipped_encoder
    from cache.verifier import load_verifier

    encoder = shipped_encoder()
    verifier = load_verifier()
    assert verifier is not None
    encode, judge = [], []
    for new_text, old_text in zip(asked[:100], stored[:100], strict=False):
        start = time.perf_counter()
        new = encoder.encode([new_text])[0]
        encode.append(time.perf_counter() - start)
        old = encoder.encode([old_text])[0]
        start = time.perf_counter()
        verifier.judge(old, new, 0.5)
        judge.append(time.perf_counter() - start)
    return {"encode_one": percentiles(encode), "verify_one_candidate": percentiles(judge)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--fill", type=int, default=500)
    parser.add_argument("--name", default="", help="label: writes cache_latency_NAME.json")
    args = parser.parse_args()
    stored, asked = sample(*questions(), args.fill, args.requests)
    upstream = start_fake_upstream()
    gateway = start_gateway(config(upstream), env={"LLMGW_LOG_LEVEL": "warning", **os.environ})
    try:
        with httpx.Client(
            base_url=gateway.url, headers={"authorization": f"Bearer {KEY}"}, timeout=120
        ) as client:
            for question in stored:
                timed(client, question, 0)
            timed(client, "warm-up", 0.7)
            report: dict[str, Any] = {"filled": len(stored), **interleaved(client, asked)}
        report.update(beside(gateway.url, asked[: max(50, args.requests // 3)]))
        report.update(components(asked, stored))
        report["load_average"] = os.getloadavg()
        report["name"] = args.name
    finally:
        gateway.stop()
        upstream.stop()
    print(f"{'path':28} {'p50 ms':>8} {'p99 ms':>8} {'n':>5}")
    for name in (
        "semantic_miss",
        "bypass",
        "bypass_alone",
        "bypass_beside_bypass",
        "bypass_beside_semantic",
        "encode_one",
        "verify_one_candidate",
    ):
        row = report[name]
        print(f"{name:28} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f} {row['n']:5d}")
    print(f"semantic lookup adds p50 {report['added_p50_ms']:.2f} ms, p99 {report['added_p99_ms']:.2f} ms "
          f"({report['semantic_hits_not_timed']} hits not timed); load {report['load_average']}")  # fmt: skip
    print(f"wrote {write_json('cache_latency' + (f'_{args.name}' if args.name else ''), report)}")


if __name__ == "__main__":
    main()
