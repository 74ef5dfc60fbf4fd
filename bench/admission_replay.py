"""Issue 44's targets through the real gateway in front of a pool of real engines (CPU, SmolLM2), driven by AIPerf
(bench/lib/trace_aiperf.py: build/aiperf-venv with aiperf==0.13.0, SmolLM2's tokenizer in build/hf-cache).

Pool: `--replicas` `llmgw engine serve` processes (SmolLM2-135M int4, one thread each, at most `--max-num-seqs`
running: the engine's own batch limit, as vLLM's --max-num-seqs), one alias `pool`, behind `--gateways` gateway
replicas sharing Redis (127.0.0.1:6379) and one database; each AIPerf process sends to one replica (tenant i to
replica i mod gateways). The gateways learn each engine's slots from its scraped metrics (no max_concurrency
unless `--max-concurrency`); the class's rank reaches the engines as vLLM's `priority`. Every case runs with
admission on (`fair`: weighted fair sharing between tenants), on without latency feedback (`noguard`:
routing.admission.slo_guard.enabled=false), on with `fair: false` (`fifo`), and `off`
(routing.admission.enabled=false), each with fresh gateway processes. `--no-send-priority`: the engines see
every request alike (vLLM without --scheduling-policy priority), so only the gateway separates the classes.

Load is relative to the pool's capacity, calibrated as bench/trace_replay.py does: batch-1 seconds per prompt
and per output token on each engine; a slice's work is Σ(batch-1 seconds), and a load of L over D seconds is a
run of consecutive trace requests holding L × replicas × D seconds of work, re-timed to span D.

1. priority: an interactive tenant (class interactive) replays a Mooncake conversation-trace slice at
   `--interactive-load` alone (its baseline, admission fair and off), then beside a batch tenant (class batch)
   replaying the Azure code trace at `--batch-load` (3×), once per engine step share with `--prefill-shares`.
   The pool's closed-loop capacity on the batch mix (tokens/s, batch-1 work/s) × (1 − the interactive tenant's
   served work ÷ the pool's) is the batch tenant's "remaining capacity". Every case starts on idle engines.
   Reported: interactive p95 TTFT ÷ alone (target ≤ 1.5), goodput against its class's SLO (≥ 95 %), batch
   served tokens/s ÷ remaining capacity (≥ 90 %), refusals by status with how many carried Retry-After,
   timeouts (AIPerf's client timeout `--client-timeout-s`; target none) split into waits (nothing came) and
   answers cut while streaming (the client's total timeout shorter than the answer).
2. fair share: two standard tenants replay two Azure conversation-trace slices at `--share-loads` (2× and
   1.5×): served tokens per 30 s window from AIPerf's records, Jain's index per window (target ≥ 0.95); then
   weights 2 : 1 (the weight-2 tenant offers the smaller load): shares per window (target within 10 % of 2).
3. overhead: bench/admission_overhead.py (fake upstream, on / off), plus the interactive tenant alone with
   admission fair and off (TTFT p50 difference).

    .venv/bin/python -m bench.admission_replay                       # bench/results/admission_replay.json
    .venv/bin/python -m bench.admission_replay --gateways 1 --scenarios fair_share --name admission_replay_1gw
"""

import argparse
import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.admission_overhead import measure as measure_overhead
from bench.admission_overhead import print_table as print_overhead
from bench.lib import trace_data as td
from bench.lib.admission_pool import (
    REDIS_URL,
    GatewayFleet,
    Tenant,
    compact,
    engine_window,
    launch,
    learn_capacity,
    new_database_url,
    pool_capacity,
    pool_config,
    provision,
    sample_engines,
    sample_slots,
    slot_stats,
    wait_idle,
)
from bench.lib.admission_records import Record, jain, overlap, read_records, served_windows, summarise
from bench.lib.admission_report import print_tables, targets
from bench.lib.admission_slices import fit, scaled, slice_load
from bench.lib.engine_http import EngineServer
from bench.lib.engine_pool import add_pool_arguments, pool_engines, restart_pool
from bench.lib.harness import ROOT, write_json
from bench.lib.trace_aiperf import aiperf_command
from bench.trace_replay import calibrate
from routing.admission.config import AdmissionSettings

TENANTS = [
    Tenant("probe", "standard"), Tenant("interactive", "interactive"), Tenant("batch", "batch"),
    Tenant("std-a", "standard"), Tenant("std-b", "standard"), Tenant("std-heavy", "standard", 2.0),
    Tenant("std-light", "standard", 1.0),
]  # fmt: skip
CLASS_OF = {t.name: t.service_class for t in TENANTS}


@dataclass
class Load:
    tenant: str
    trace: list[td.TraceRequest]
    length_div: int
    delay_s: float = 0.0  # its AIPerf starts this much after the others (a small one starts faster)


@dataclass
class Pool:
    args: argparse.Namespace
    engines: list[EngineServer]
    cal: dict[str, float]
    keys: dict[str, str]
    database_url: str
    capacity: dict[str, float]  # pool_capacity on the batch mix: tok_s, work_rate (batch-1 s per second)

    def work(self, records: list[Record], window: tuple[float, float]) -> float:
        """Batch-1 seconds of the requests answered in `window`, per second of it."""
        lo, hi = window
        done = [r for r in records if r.status == "200" and lo <= r.end_s < hi]
        seconds = sum(r.prompt_tokens * self.cal["s_per_prompt_token"] + r.completion_tokens
                      * self.cal["s_per_output_token"] for r in done)  # fmt: skip
        return seconds / (hi - lo) if hi > lo else 0.0


def max_model_len(args: argparse.Namespace) -> int:
    return args.max_input + args.max_output + 32  # + the chat template


def classes(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The default classes, with the CPU-scaled SLOs and deadlines of this run."""
    out = {name: c.model_dump() for name, c in AdmissionSettings().classes.items()}
    out["interactive"].update(ttft_s=args.interactive_ttft_s, itl_s=args.interactive_itl_s)
    out["batch"].update(queue_deadline_s=args.batch_deadline_s)
    return out


async def run_case(pool: Pool, label: str, mode: str, loads: list[Load]) -> dict[str, Any]:
    """Fresh gateways in `mode`, the pool's slots learned, then one AIPerf per tenant, all at once."""
    args = pool.args
    prefix = f"llmgw-admbench-{time.time_ns()}:"
    config = pool_config(pool.engines, mode, pool.database_url, classes(args), args.max_concurrency, prefix,
                         None if args.no_redis else REDIS_URL, not args.no_send_priority,
                         args.engine_queue)  # fmt: skip
    fleet = GatewayFleet(config, args.gateways)
    started = time.time()
    load_before = os.getloadavg()
    try:
        await fleet.ready()
        await asyncio.sleep(1.5)  # the first scrapes
        slots = await learn_capacity(fleet, pool.keys["probe"], args.probe_clients) if mode != "off" else []
        await asyncio.sleep(2.0)
        idle_wait_s = await wait_idle(pool.engines)
        commands, outs = [], []
        for index, load in enumerate(loads):
            case = Path(args.work_dir) / label / mode
            trace_file = td.write_mooncake(load.trace, case / f"{load.tenant}.jsonl")
            slo = classes(args)[CLASS_OF[load.tenant]]
            tenant_args = argparse.Namespace(**{**vars(args), "length_div": load.length_div,
                                                "slo_ttft_ms": slo["ttft_s"] * 1000, "slo_itl_ms": slo["itl_s"] * 1000,
                                                "aiperf_timeout_s": args.client_timeout_s})  # fmt: skip
            outs.append(case / load.tenant)
            commands.append(aiperf_command(tenant_args, fleet.url(index), pool.keys[load.tenant], trace_file,
                                           outs[-1], args.seed + index) + ["--export-http-trace"])  # fmt: skip
        timeout = args.client_timeout_s + max(r.t_ms for load in loads for r in load.trace) / 1000 + 300
        slots_seen: list[list[float | None]] = []
        factors_seen: list[list[float | None]] = []
        engine_seen: list[dict[str, float]] = []
        sampling = asyncio.create_task(sample_slots(fleet, slots_seen, factors_seen))
        engine_sampling = asyncio.create_task(sample_engines(pool.engines, engine_seen))
        walls = await asyncio.gather(*(launch(c, load.delay_s, timeout, pool.engines if load.delay_s else None)
                                       for c, load in zip(commands, loads, strict=True)))  # fmt: skip
        sampling.cancel()
        engine_sampling.cancel()
        series = await fleet.metrics()
    finally:
        fleet.stop()
    records = {load.tenant: read_records(out) for load, out in zip(loads, outs, strict=True)}
    counts = {t: len(r) for t, r in records.items()}
    print(f"== {label} {mode}: {counts} requests, {time.time() - started:.0f} s, slots {slots}, "
          f"load avg {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    return {"records": records, "slots_learned": slots, "idle_wait_s": idle_wait_s, "slots_during": slot_stats(slots_seen),
            "batch_share_factor": slot_stats(factors_seen), "engine_series": engine_seen,
            "aiperf_wall_s": walls, "case_wall_s": time.time() - started, "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
            "gateway_series": [compact(s) for s in series]}  # fmt: skip


def tenant_figures(
    pool: Pool,
    case: dict[str, Any],
    tenant: str,
    window: tuple[float, float],
    records: list[Record] | None = None,
) -> dict:
    slo = classes(pool.args)[CLASS_OF[tenant]]
    records = case["records"][tenant] if records is None else records
    return {**summarise(records, slo["ttft_s"] * 1000, slo["itl_s"] * 1000, window),
            "work_rate": pool.work(records, window)}  # fmt: skip


def case_meta(case: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in case.items() if k != "records"}


async def priority(pool: Pool, results: dict[str, Any]) -> None:
    args = pool.args
    lead, span = args.lead_s, args.duration_s
    inter, inter_div = fit("mooncake", pool, args.start_s, args.interactive_load, span, lead)
    batch, batch_div = fit("azure_code", pool, args.start_s, args.batch_load, span + 2 * lead)
    out = results.setdefault(
        "priority",
        {
            "slices": {
                "interactive": slice_load(inter, pool, span),
                "batch": slice_load(batch, pool, span + 2 * lead),
            }
        },
    )
    cap = {"served_tok_s": pool.capacity["tok_s"], "work_rate": pool.capacity["work_rate"]}
    alone: dict[str, dict] = {}
    admission = set(args.modes) - {"off"}  # alone, every admission mode is fair (no one to share with)
    for mode in [m for m in ("fair", "off") if m in args.modes or (m == "fair" and admission)]:
        case = await run_case(pool, "alone", mode, [Load("interactive", inter, inter_div)])
        records = case["records"]["interactive"]
        span_alone = (records[0].start_s, records[-1].start_s)
        alone[mode] = tenant_figures(pool, case, "interactive", span_alone)
        steps = engine_window(case["engine_series"], span_alone, args.batched_tokens, len(pool.engines))
        out.setdefault("alone", {})[mode] = {
            **case_meta(case),
            "interactive": alone[mode],
            "engine_steps": steps,
        }
        save(results)
    current = (args.prefill_shares or [None])[0]  # the engines started with it
    for mode, share in [(m, n) for m in args.modes for n in args.prefill_shares or [None]]:
        if share != current:  # the engines restarted with this lower-priority prefill share (a sweep)
            await restart_pool(pool.engines, args, max_model_len(args), lower_priority_prefill_tokens=share)
            current = share
        loads = [
            Load("interactive", inter, inter_div, args.interactive_delay_s),
            Load("batch", batch, batch_div),
        ]
        case = await run_case(pool, "mixed" if share is None else f"mixed{share}", mode, loads)
        both = case["records"]["interactive"], case["records"]["batch"]
        window = overlap(*both)  # AIPerf's start-up differs: only the interactive requests beside the batch
        mixed = [r for r in both[0] if window[0] <= r.start_s <= window[1]]
        i = {
            **tenant_figures(pool, case, "interactive", window, mixed),
            "in_overlap": len(mixed) / len(both[0]),
        }
        b = tenant_figures(pool, case, "batch", window)
        remaining = cap["served_tok_s"] * max(0.0, 1 - i["work_rate"] / max(cap["work_rate"], 1e-9))
        base = alone["off" if mode == "off" else "fair"]
        out.setdefault("mixed", {})[mode if share is None else f"{mode}@{share}"] = {
            **case_meta(case), "interactive": i, "batch": b, "remaining_tok_s": remaining,
            "p95_vs_alone": (i["ttft_p95_ms"] or float("inf")) / (base["ttft_p95_ms"] or float("inf")),
            "batch_vs_remaining": b["served_tok_s"] / remaining if remaining else None,
            "window_s": window[1] - window[0],
            "engine_steps": engine_window(case["engine_series"], window, args.batched_tokens, len(pool.engines)),
        }  # fmt: skip
        save(results)


async def fair_share(pool: Pool, results: dict[str, Any]) -> None:
    args = pool.args
    span = args.share_duration_s
    high, div = fit("azure_conv", pool, args.start_s, args.share_loads[0], span)
    low, _ = fit("azure_conv", pool, args.start_s + 900, args.share_loads[1], span)
    slices = {"high": slice_load(high, pool, span), "low": slice_load(low, pool, span)}
    out = results.setdefault("fair_share", {"slices": slices})
    cases = [("equal", m, Load("std-a", high, div), Load("std-b", low, div)) for m in args.modes]
    cases += [("weighted", m, Load("std-heavy", low, div), Load("std-light", high, div))
              for m in args.modes if m != "off"]  # fmt: skip
    for label, mode, first, second in [c for c in cases if c[0] in args.share_cases]:
        case = await run_case(pool, label, mode, [first, second])
        a, b = case["records"][first.tenant], case["records"][second.tenant]
        lo, hi = overlap(a, b)
        wa, wb = served_windows(a, lo, hi, args.window_s), served_windows(b, lo, hi, args.window_s)
        ratios = [x / y if y else None for x, y in zip(wa, wb, strict=True)]
        out.setdefault(label, {})[mode] = {
            **case_meta(case), first.tenant: tenant_figures(pool, case, first.tenant, (lo, hi)),
            second.tenant: tenant_figures(pool, case, second.tenant, (lo, hi)),
            "windows": {first.tenant: wa, second.tenant: wb}, "window_s": args.window_s,
            "jain": [jain([x, y]) for x, y in zip(wa, wb, strict=True)],
            "ratio": ratios, "ratio_overall": sum(wa) / sum(wb) if sum(wb) else None,
        }  # fmt: skip
        save(results)


def save(results: dict[str, Any]) -> None:
    results["targets"] = targets(results)
    write_json(results["setup"]["name"], results)


async def main_async(args: argparse.Namespace) -> None:
    results: dict[str, Any] = {
        "setup": {**vars(args), "load_avg_start": os.getloadavg(), "started": time.time()}
    }
    if "overhead" in args.scenarios:
        results["overhead"] = await asyncio.to_thread(
            measure_overhead, args.overhead_rounds, args.overhead_requests
        )
        save(results)
    share = {"lower_priority_prefill_tokens": args.prefill_shares[0]} if args.prefill_shares else {}
    engines = pool_engines(args, max_model_len(args), **share)
    try:
        for engine in engines:
            await engine.wait_ready(timeout=900)
        cal = await calibrate(engines)
        database_url = new_database_url()
        config = pool_config(engines, "fair", database_url, classes(args), None, "llmgw-admbench:")
        batch_mix = scaled("azure_code", args, args.start_s)[0][:2000]
        capacity = await pool_capacity(engines, batch_mix, cal, args.capacity_s, 2 * args.max_num_seqs)
        pool = Pool(args, engines, cal, await provision(config, TENANTS), database_url, capacity)
        results["setup"].update(calibration=cal, capacity=capacity)
        print(f"== calibration {cal}\n== capacity {capacity}", flush=True)
        if "priority" in args.scenarios:
            await priority(pool, results)
        if "fair_share" in args.scenarios:
            await fair_share(pool, results)
    finally:
        for engine in engines:
            engine.stop()
    results["setup"].update(load_avg_end=os.getloadavg(), wall_s=time.time() - results["setup"]["started"])
    save(results)
    print_tables(results)
    if "overhead" in results:
        print_overhead(results["overhead"])
    print(f"wrote {ROOT / 'bench' / 'results' / (args.name + '.json')}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--scenarios", nargs="+", default=["overhead", "priority", "fair_share"])
    add("--modes", nargs="+", default=["fair", "fifo", "off"])
    add("--gateways", type=int, default=2, help="gateway replicas sharing Redis")
    add("--max-concurrency", type=int, default=None, help="deployment max_concurrency (default: learned)")
    add("--engine-queue", type=int, default=None, help="routing.admission.engine_queue (default: as shipped)")
    add_pool_arguments(add, kv_mb=96, batched_tokens=128)
    parser.set_defaults(max_num_seqs=4, dtype="int4")
    add("--no-redis", action="store_true", help="one gateway, admission and limits in its memory (no Redis)")
    add("--no-send-priority", action="store_true", help="the engines get no priority (vLLM without it)")
    add("--max-output", type=int, default=256, help="the engines' max_model_len is --max-input + this")
    add("--length-div", type=int, default=64, help="Mooncake lengths ÷ this")
    add(
        "--azure-length-div", type=int, default=8, help="Azure lengths ÷ this (their prompts are ~5× shorter)"
    )
    add("--max-input", type=int, default=256)
    add("--start-s", type=float, default=600, help="trace second the slices start at")
    add("--interactive-load", type=float, default=0.4)
    add("--batch-load", type=float, default=3.0)
    add("--share-loads", type=float, nargs=2, default=[2.0, 1.5])
    add("--duration-s", type=float, default=60, help="the interactive tenant's span")
    add("--lead-s", type=float, default=10, help="the batch trace starts this much earlier, ends later")
    add("--interactive-delay-s", type=float, default=5,
        help="its AIPerf starts this long after the batch tenant's first request reached the engines")  # fmt: skip
    add("--prefill-shares", type=int, nargs="+", default=None,
        help="priority: the beside-batch case once per engine lower_priority_prefill_tokens (engines restarted)")  # fmt: skip
    add("--share-duration-s", type=float, default=90)
    add("--share-cases", nargs="+", default=["equal", "weighted"])
    add("--window-s", type=float, default=30)
    add("--interactive-ttft-s", type=float, default=2.0, help="the interactive class's TTFT SLO (CPU-scaled)")
    add("--interactive-itl-s", type=float, default=0.2)
    add(
        "--batch-deadline-s",
        type=float,
        default=20,
        help="the batch class's queue deadline (< client timeout)",
    )
    add("--client-timeout-s", type=float, default=40, help="AIPerf's request timeout")
    add("--probe-clients", type=int, default=16)
    add("--capacity-s", type=float, default=30, help="closed-loop saturation measuring the pool's capacity")
    add("--overhead-rounds", type=int, default=12)
    add("--overhead-requests", type=int, default=250)
    add("--seed", type=int, default=44)
    add("--work-dir", default="/tmp/admission_replay")
    add("--name", default="admission_replay")
    signal.signal(signal.SIGTERM, _interrupted)  # stop the engines and gateways on the way out
    asyncio.run(main_async(parser.parse_args()))


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
