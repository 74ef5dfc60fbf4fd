"""Replay a production trace through AIPerf -> gateway -> engine pool, per routing strategy (issue 43).

The load generator is AIPerf (PyPI `aiperf`, pinned in pyproject's `trace` extra; it lives in its own venv,
build/aiperf-venv, because it pins pandas, prometheus-client, transformers and others that the project's
.venv must not change under the other benches): its `mooncake_trace` loader synthesises each prompt from
the hash ids (equal ids -> equal token blocks of `--isl-block-size` tokens, from SmolLM2's tokenizer) and
its fixed schedule fires every request at its timestamp. This script only prepares its input (a session
sample of the trace, lengths ÷ `--length-div` with the block ÷ the same, timestamps × a factor that sets the
load) and reads its results; `max_tokens` = the trace's output length with `ignore_eos` (the engine honours
both), so every answer has the trace's length.

Load: each engine is calibrated first (batch 1, no cache: seconds per prompt token and per output token);
the offered load is Σ(batch-1 work) ÷ (span × replicas), so 0.7 means the pool would be busy 70 % of the
time serving requests one at a time (batching makes it less, prefix hits less again).

Bounds (bench/lib/trace_data.py): the slice's infinite-cache hit rate, and the greedy best assignment over the
replicas with each engine's real KV capacity (its vllm:cache_config_info num_gpu_blocks × block_size).
Each strategy gets a fresh gateway and its own AIPerf seed, so its prompt texts are new: no strategy
inherits another's cache. Printed per load and strategy: TTFT p50/p90/p99, ITL p50/p90, e2e p50/p90,
output and total tok/s, goodput share (TTFT and ITL SLO), the engines' prefix-cache hit rate (Δhits/Δqueries
summed, and per replica) as a share of both bounds, 429/503 and other errors.

    .venv/bin/python -m bench.trace_replay                 # CPU: 2 SmolLM2 engines, loads 0.7 and 1.2
    .venv/bin/python -m bench.trace_replay --trace azure_conv --strategies round_robin engine_score
"""

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from bench.lib import trace_data as td
from bench.lib.admission_pool import pool_capacity
from bench.lib.admission_records import percentile
from bench.lib.engine_http import EngineServer
from bench.lib.engine_pool import (
    KEY,
    add_pool_arguments,
    gateway_config,
    one_request,
    pool_engines,
    wait_ready,
)
from bench.lib.harness import RESULTS, start_gateway, write_json
from bench.lib.trace_aiperf import aiperf_command, read_aiperf, run_aiperf
from routing.monitor import parse_engine_metrics
from routing.replica import EngineLoad

STRATEGIES = ["round_robin", "least_outstanding", "prefix_affinity", "engine_score"]
CALIBRATION_WORDS = "policy ledger invoice region tenant quota replica shard"  # 8 words: ~8.3 tokens


async def engine_info(engine: EngineServer) -> dict[str, float]:
    """Counters plus the KV capacity (tokens) from vllm:cache_config_info, read as the router reads it."""
    async with aiohttp.ClientSession() as http, http.get(f"{engine.url}/metrics") as response:
        kv_tokens = parse_engine_metrics(await response.text(), EngineLoad(), 0.0).kv_tokens
    return {**({"kv_tokens": kv_tokens} if kv_tokens else {}), **await engine.counters()}


async def calibrate(engines: list[EngineServer], prompt_tokens: int = 400) -> dict[str, float]:
    """Batch-1 seconds per prompt token and per output token, each engine alone, medians of two."""
    prefill, decode = [], []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for engine in engines:
            for i in range(3):  # the first one warms the engine up and is not counted
                prompt = f"calibration {i} {engine.port}: " + " ".join(
                    [CALIBRATION_WORDS] * (prompt_tokens * 10 // 83)
                )
                result = await one_request(session, engine.url, prompt, 24, model="m")
                if i:
                    prefill.append(result["ttft"] / max(result["prompt_tokens"], 1))
                    decode.append((result["latency"] - result["ttft"]) / max(result["tokens"] - 1, 1))
    prefill.sort(), decode.sort()
    return {"s_per_prompt_token": prefill[len(prefill) // 2], "s_per_output_token": decode[len(decode) // 2]}


def error_counts(records: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        code = str(record.get("status") or "other")
        counts[code] = counts.get(code, 0) + 1
    return counts


async def run_one(
    args: argparse.Namespace, engines: list[EngineServer], strategy: str, trace_file: Path, seed: int,
    label: str,
) -> dict[str, Any]:  # fmt: skip
    config = gateway_config(engines, strategy)
    config["routing"].update(json.loads(args.routing))  # e.g. engine_score's weights being tuned
    gateway = start_gateway(config)
    try:
        async with aiohttp.ClientSession(headers={"authorization": f"Bearer {KEY}"}) as session:
            await wait_ready(session, gateway.url)
        await asyncio.sleep(1.5)  # the first metrics scrape
        before = [await engine_info(e) for e in engines]
        out = Path(args.work_dir) / label / strategy
        command = aiperf_command(args, gateway.url, KEY, trace_file, out, seed)
        wall = await asyncio.to_thread(run_aiperf, command, args.aiperf_timeout_s)
        await asyncio.sleep(0.5)
        after = [await engine_info(e) for e in engines]
    finally:
        gateway.stop()
    summary, errors = read_aiperf(out)
    replicas = []
    for b, a in zip(before, after, strict=True):
        hits = a.get("vllm:prefix_cache_hits_total", 0) - b.get("vllm:prefix_cache_hits_total", 0)
        queries = a.get("vllm:prefix_cache_queries_total", 0) - b.get("vllm:prefix_cache_queries_total", 0)
        done_requests = a.get("vllm:request_success_total", 0) - b.get("vllm:request_success_total", 0)
        replicas.append({"hits": hits, "queries": queries, "requests": done_requests,
                         "hit_rate": hits / queries if queries else 0.0})  # fmt: skip
    hits, queries = sum(r["hits"] for r in replicas), sum(r["queries"] for r in replicas)
    return {"strategy": strategy, "load": label, **summary, "errors": errors, "aiperf_wall_s": wall,
            "hit_rate": hits / queries if queries else 0.0, "replicas": replicas}  # fmt: skip


def print_table(rows: list[dict], setup: dict) -> None:
    print(f"\ntrace replay (AIPerf -> gateway -> {setup['replicas']} engines): {json.dumps(setup)}")
    head = f"{'load':<5} {'strategy':<18} {'TTFT p50':>9} {'p90':>8} {'ITL p50':>8} {'e2e p90':>8} {'out tok/s':>9} "
    print(
        head
        + f"{'goodput':>8} {'hit':>6} {'/best':>6} {'/inf':>6} {'p90/floor':>9}  errors  per-replica requests"
    )
    for r in rows:
        bounds = r["bounds"]
        print(f"{r['load']:<5} {r['strategy']:<18} {r['ttft_p50_ms']:>7.0f}ms {r['ttft_p90_ms']:>6.0f}ms "
              f"{r['itl_p50_ms']:>6.0f}ms {r['e2e_p90_ms']:>6.0f}ms {r['output_tok_s']:>9.1f} "
              f"{r['goodput_share']:>8.2f} {r['hit_rate']:>6.3f} {r['hit_rate'] / max(bounds['best'], 1e-9):>6.2f} "
              f"{r['hit_rate'] / max(bounds['infinite'], 1e-9):>6.2f} "
              f"{_ratio(r['ttft_p90_ms'], bounds.get('ttft_floor_p90_ms')):>9}  {r['errors'] or '-'}  "
              f"{[round(x['requests']) for x in r['replicas']]}")  # fmt: skip


def _ratio(value: float, floor: float | None) -> str:
    return f"{value / floor:.1f}" if floor else "-"


async def offered_rate(args: argparse.Namespace, engines: list[EngineServer], sample: list[td.TraceRequest],
                       cal: dict[str, float]) -> tuple[float, dict[str, float]]:  # fmt: skip
    """Batch-1 seconds of work per second that a load of 1.0 offers. `batch1`: the replicas' count (each busy
    all the time serving one request at a time). `capacity`: what the pool served when saturated by
    closed-loop clients on the sample's lengths (no prefix hits), for a GPU, where batching multiplies it."""
    if args.load_basis == "batch1":
        return float(args.replicas), {}
    if args.work_rate:  # measured by an earlier invocation on the same pool
        return args.work_rate, {"work_rate": args.work_rate, "given": True}
    capacity = await pool_capacity(engines, sample, cal, args.capacity_s, args.capacity_clients)
    return capacity["work_rate"], capacity


async def main_async(args: argparse.Namespace) -> None:
    trace = td.load(args.trace, Path(args.traces_dir))
    sample = td.scale(
        td.sample_sessions(td.window(trace, args.start_s, args.span_s), args.span_s, args.one_in),
        args.length_div,
        1.0,
        args.max_input,
    )
    block = td.BLOCK_TOKENS // args.length_div
    longest = max(r.input_length + r.output_length for r in sample)
    engines = pool_engines(args, max(args.max_input + 256, longest + 16))
    rows: list[dict] = []
    runs = [(load, args.strategies) for load in args.loads]
    runs += [(load, args.sweep_strategies) for load in args.sweep_loads]
    try:
        for engine in engines:
            await engine.wait_ready(timeout=900)
        cal = await calibrate(engines, args.calibration_tokens)
        kv_tokens = min([int((await engine_info(e))["kv_tokens"]) for e in engines])
        work_rate, capacity = await offered_rate(args, engines, sample, cal)
        work = td.batch1_work(sample, cal)
        span = (sample[-1].t_ms - sample[0].t_ms) / 1000
        setup = {k: getattr(args, k) for k in ("trace", "start_s", "routing", "span_s", "one_in", "length_div", "max_input", "replicas",
                                               "kv_mb", "threads", "dtype", "device", "random_shape", "slo_ttft_ms",
                                               "slo_itl_ms", "load_basis", "duration_s", "batched_tokens",
                                               "max_num_seqs")}  # fmt: skip
        setup.update(sample_stats=td.describe(sample), calibration=cal, batch1_work_s=work, block_tokens=block,
                     capacity=capacity, work_rate_at_load_1=work_rate, kv_tokens_per_replica=kv_tokens)  # fmt: skip
        print(f"slice: {setup}", flush=True)
        for load, strategies in runs:
            label = f"{load:g}"
            factor = work / (load * span * work_rate)
            if args.time_factors:
                factor = args.time_factors[[x for x, _ in runs].index(load)]
            setup[f"time_factor_{label}"] = factor
            timed = td.retime(sample, factor)
            if args.duration_s:  # the first duration_s seconds of the re-timed slice
                timed = [r for r in timed if r.t_ms - timed[0].t_ms <= args.duration_s * 1000]
            trace_file = td.write_mooncake(timed, Path(args.work_dir) / f"trace_{label}.jsonl")
            offered = {"requests": len(timed), "span_s": (timed[-1].t_ms - timed[0].t_ms) / 1000,
                       "bounds": slice_bounds(timed, args.replicas, kv_tokens, block, cal)}  # fmt: skip
            offered["rps"] = len(timed) / max(offered["span_s"], 1e-9)
            setup[f"offered_{label}"] = offered
            for index, strategy in enumerate(strategies):
                row = await run_one(args, engines, strategy, trace_file, args.seed + index, label)
                rows.append({**row, "bounds": offered["bounds"], "offered_rps": offered["rps"]})
                path = write_json(args.name, {"setup": setup, "rows": rows, "slo_max": slo_max(rows, args)})
                print(f"load {label} {strategy}: done", flush=True)
    finally:
        for engine in engines:
            engine.stop()
    print_table(rows, setup)
    print(f"wrote {path}")


def slice_bounds(requests: list[td.TraceRequest], replicas: int, kv_tokens: int, block: int,
                 cal: dict[str, float]) -> dict:  # fmt: skip
    """Hit-rate bounds, and TTFT's floor: each request's uncached prompt (infinite cache) prefilled at the
    batch-1 speed with nothing queued, p50 / p90 over the slice (what no routing can beat)."""
    best = td.best_assignment_hit_rate(requests, replicas, kv_tokens // block, block)
    floor = [n * cal["s_per_prompt_token"] * 1000 for n in td.infinite_cache_uncached(requests, block)]
    return {"infinite": td.infinite_cache_hit_rate(requests, block), "best": best["hit_rate"],
            "best_requests_per_replica": best["requests_per_replica"],
            "ttft_floor_p50_ms": percentile(floor, 0.5), "ttft_floor_p90_ms": percentile(floor, 0.9)}  # fmt: skip


def slo_max(rows: list[dict], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Per strategy, the largest offered rate (requests/s) whose p90 TTFT and p90 ITL met the SLO, and the
    smallest that missed it (the time-scaled sweep `llmgw plan` is checked against)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        met = r["ttft_p90_ms"] <= args.slo_ttft_ms and r["itl_p90_ms"] <= args.slo_itl_ms and not r["errors"]
        entry = out.setdefault(r["strategy"], {})
        key = "largest_met_rps" if met else "smallest_missed_rps"
        pick = max if met else min
        entry[key] = pick(entry.get(key, r["offered_rps"]), r["offered_rps"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", default="mooncake", choices=sorted(td.FILES))
    parser.add_argument("--span-s", type=float, default=1800, help="trace seconds sampled from")
    parser.add_argument("--one-in", type=int, default=60, help="keep one conversation in this many")
    parser.add_argument("--length-div", type=int, default=16)
    parser.add_argument("--max-input", type=int, default=1024, help="scaled prompts cut to this many tokens")
    add = parser.add_argument
    add("--loads", type=float, nargs="+", default=[0.7, 1.2], help="every strategy runs at each")
    add("--strategies", nargs="+", default=STRATEGIES)
    add("--sweep-loads", type=float, nargs="*", default=[], help="more loads, for --sweep-strategies only")
    add("--sweep-strategies", nargs="+", default=["engine_score"])
    add("--load-basis", choices=["batch1", "capacity"], default="batch1", help="what a load of 1.0 is")
    add("--capacity-s", type=float, default=30, help="closed-loop saturation (--load-basis capacity)")
    add(
        "--work-rate",
        type=float,
        default=None,
        help="a load of 1.0 in batch-1 s/s, as a run's setup printed it (skips the capacity measurement)",
    )
    add(
        "--time-factors",
        type=float,
        nargs="+",
        default=None,
        help="one re-timing factor per load (--loads, then --sweep-loads), as a run's setup recorded them",
    )
    add("--capacity-clients", type=int, default=16, help="closed-loop clients per engine")
    add("--start-s", type=float, default=0, help="trace second the sampled span starts at (1800: 2nd half)")
    add(
        "--routing",
        default="{}",
        help="JSON merged into the gateway's routing settings (tuning engine_score)",
    )
    add(
        "--calibration-tokens",
        type=int,
        default=400,
        help="batch-1 calibration prompt (a GPU: a trace-sized one)",
    )
    add("--duration-s", type=float, default=None, help="cut each re-timed slice to this many seconds")
    add_pool_arguments(add, kv_mb=48, batched_tokens=256)
    add("--slo-ttft-ms", type=float, default=2000)
    add("--slo-itl-ms", type=float, default=200)
    add("--seed", type=int, default=43)
    add("--aiperf-timeout-s", type=float, default=900)
    add("--work-dir", default="/tmp/trace_replay")
    add("--name", default="trace_replay_cpu", help="results file name under bench/results")
    parser.add_argument("--reread", action="store_true",
                        help="no run: read AIPerf's files under --work-dir again into the results, print the table")  # fmt: skip
    args = parser.parse_args()
    if args.reread:
        reread(args)
        return
    asyncio.run(main_async(args))


def reread(args: argparse.Namespace) -> None:
    """The results file rebuilt from AIPerf's own artifacts (kept under --work-dir), e.g. after a parser fix."""
    data = json.loads((RESULTS / f"{args.name}.json").read_text())
    for row in data["rows"]:
        summary, errors = read_aiperf(Path(args.work_dir) / row["load"] / row["strategy"])
        row.update(summary, errors=errors)
        row.setdefault("bounds", data.get("bounds"))  # results written before bounds were per load
    write_json(args.name, data)
    print_table(data["rows"], data["setup"])


if __name__ == "__main__":
    main()
