"""The engine on realistic serving work (issue 45), in-process on one GPU, random weights in Llama-3 shapes.

    bench/gpu.sh python3 -m bench.engine_serving_gpu [--shapes llama-8b,llama-1b] [--scenarios burst,sweep,
        poisson,decode128,breakdown,prefix] [--configs 4096:256,2048:256] [--rates 0.5,0.8,1.0] [--out DIR]
    .venv/bin/python -m bench.engine_serving_gpu --quick      # CPU dry run: tiny model, small workload

Workload (seeded): `--requests` (512) requests submitted at once, prompts uniform in 128-2,048 tokens, answers
uniform in 64-512 (greedy, ignore_eos: every answer is exactly its length). Each run draws fresh token ids
with the same lengths, so no run hits the prefix cache of the one before. Scenarios:
  burst      the workload at the first --configs entry (token budget per step : max running sequences)
  sweep      the same workload at every --configs entry (budget and admission cap chosen by measurement)
  poisson    Poisson arrivals of --poisson-requests requests at --rates x the burst's request throughput
  ab         at each --ab-configs entry: decode pipelined while requests wait for a slot, off then on
  trace      a window of --trace (Azure conv by default) at full length and its own timing; prompts are
             random ids of each request's length (--max-model-len must hold them)
  decode128  128 requests at once: decode-only steps at 128 running sequences against their memory floor
  breakdown  profiled steps of the decode128 workload (attention / matmul / other kernels / sampling / host)
  prefix     TTFT of a 1,024-token shared prefix + 32 own tokens, cold vs prefix-cached
  graphs     the burst with prefill/mixed graphs only up to 256 tokens and 8 sequences, then up to the step
             budget (engine setting mixed_graphs), twice in turn; the first mixed graphs' logits against the
             eager step's (bench/lib/engine_graph_check.py)
Each run prints output and total tok/s, the per-step bound and the share reached (bench/lib/engine_serving_trace.py
defines it), TTFT / ITL p50/p90/p99 and goodput under --slo-ttft / --slo-itl. The table is printed last;
JSON goes to --out (default bench/results) as engine_serving_gpu.json.
"""

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from bench.engine_gpu import copy_bandwidth, prefix_ttft
from bench.lib.engine_gpu_models import Ours, build_ours_from, decode_bytes, random_checkpoint, sync
from bench.lib.engine_serving_trace import (
    Ceilings,
    ModelCost,
    Request,
    StepTrace,
    profile_breakdown,
    request_metrics,
    serve,
    trace_metrics,
)

RESULTS: dict = {"device": None, "runs": []}
_START = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _START:.0f}s] {message}", flush=True)


def matmul_peak() -> float:
    """bf16 FLOP/s of an 8192^3 product on random data (median of 10 after 3 warm-ups)."""
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * 8192**3 / sorted(times)[len(times) // 2]


def workload(n: int, prompt: tuple[int, int], output: tuple[int, int], vocab: int, seed: int,
             content_seed: int) -> list[Request]:  # fmt: skip
    """`n` requests: lengths from `seed` (the same every run), token ids from `content_seed`."""
    lengths, ids = random.Random(seed), random.Random(content_seed)
    shapes = [(lengths.randint(*prompt), lengths.randint(*output)) for _ in range(n)]
    return [Request([ids.randrange(10, vocab) for _ in range(p)], o) for p, o in shapes]


def with_poisson(requests: list[Request], rate: float, seed: int) -> list[Request]:
    rng, clock = random.Random(seed), 0.0
    for request in requests:
        clock += rng.expovariate(rate)
        request.arrival = clock
    return requests


def set_limits(ours: Ours, budget: int, seqs: int) -> None:
    """The scheduler's token budget per step and admission cap (within what the runner was built for)."""
    engine = ours.engine
    engine.scheduler.max_num_batched_tokens, engine.scheduler.max_num_seqs = budget, seqs
    engine.settings = engine.settings.model_copy(
        update={"max_num_batched_tokens": budget, "max_num_seqs": seqs}
    )


def run(ours: Ours, label: str, requests: list[Request], ceil: Ceilings, cost: ModelCost, args) -> dict:
    engine = ours.engine
    preempted, stats = engine.scheduler.num_preemptions, engine.block_manager.stats
    queries, hits = stats.queries, stats.hits
    trace = StepTrace(engine)
    try:
        wall = serve(engine, requests, args.temperature)
    finally:
        trace.close()
    out_tokens = sum(len(r.token_times) for r in requests)
    in_tokens = sum(len(r.prompt) for r in requests)
    row = {
        "label": label, "requests": len(requests), "prompt_tokens": in_tokens, "output_tokens": out_tokens,
        "wall_s": wall, "output_tok_s": out_tokens / wall, "total_tok_s": (in_tokens + out_tokens) / wall,
        "budget": engine.scheduler.max_num_batched_tokens, "max_seqs": engine.scheduler.max_num_seqs,
        "preemptions": engine.scheduler.num_preemptions - preempted,
        "prefix_hit_rate": (stats.hits - hits) / max(1, stats.queries - queries),
        **trace_metrics(trace.steps, cost, ceil, wall, out_tokens),
        **request_metrics(requests, args.slo_ttft, args.slo_itl),
    }  # fmt: skip
    RESULTS["runs"].append(row)
    log(f"{label}: {json.dumps(row)}")
    return row


def shape_section(shape: str, args, ceil: Ceilings) -> None:
    quick = args.quick
    cuda = torch.cuda.is_available()
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",")]
    budget, seqs = configs[0]
    settings = dict(max_model_len=args.max_model_len, max_num_batched_tokens=max(b for b, _ in configs),
                    max_num_seqs=max(128, *(s for _, s in configs)), kv_cache_memory_mb=args.kv_mb,
                    mixed_graphs=args.mixed_graphs or "graphs" in args.scenarios.split(","),
                    **args.kernel_fields)  # fmt: skip
    ours = build_ours_from(random_checkpoint(shape, "cuda" if cuda else "cpu"), shape, "bf16" if cuda else "fp32",
                           **settings)  # fmt: skip
    cost = ModelCost.of(ours.runner, decode_bytes(ours.runner))
    vocab = ours.runner.config.vocab_size
    log(f"{shape}: built; KV blocks {ours.runner.num_blocks}, cost {cost}")
    lens = ((128, 2048), (64, 512)) if not quick else ((16, 96), (4, 24))
    seed = args.seed

    def make(n: int, content: int, limit: int | None = None) -> list[Request]:
        requests = workload(n, *lens, vocab, seed, content)
        for r in requests:
            r.max_tokens = min(r.max_tokens, limit or r.max_tokens)
        return requests

    set_limits(ours, budget, seqs)
    serve(ours.engine, make(min(64, args.requests), 1, limit=16))  # warm-up: kernels of every step shape
    content = 100
    runs: dict[str, dict] = {}
    scenarios = set(args.scenarios.split(","))
    if scenarios & {"burst", "sweep", "poisson"}:
        runs["burst"] = run(
            ours, f"{shape} burst {budget}:{seqs}", make(args.requests, content), ceil, cost, args
        )
    if "sweep" in scenarios:
        for b, s in configs[1:]:
            content += 1
            set_limits(ours, b, s)
            run(ours, f"{shape} burst {b}:{s}", make(args.requests, content), ceil, cost, args)
        set_limits(ours, budget, seqs)
    if "poisson" in scenarios:
        capacity = runs["burst"]["requests"] / runs["burst"]["wall_s"]
        for fraction in (float(x) for x in args.rates.split(",")):
            content += 1
            requests = with_poisson(make(args.poisson_requests, content), fraction * capacity, content)
            run(ours, f"{shape} poisson {fraction:g}x ({fraction * capacity:.2f} req/s) {budget}:{seqs}",
                requests, ceil, cost, args)  # fmt: skip
    if "ab" in scenarios:  # the pipeline while requests wait for a slot: before (off) and after (on)
        for b, s in [tuple(int(x) for x in c.split(":")) for c in args.ab_configs.split(",")]:
            set_limits(ours, b, s)
            scheduler = ours.engine.scheduler
            for label, patch in (("before: no pipeline while waiting", True), ("after", False)):
                content += 1
                if patch:  # the condition before: any waiting request stops the pipeline
                    scheduler.can_admit = lambda scheduler=scheduler: bool(scheduler.waiting)
                try:
                    run(
                        ours, f"{shape} burst {b}:{s} {label}", make(args.requests, content), ceil, cost, args
                    )
                finally:
                    scheduler.__dict__.pop("can_admit", None)
        set_limits(ours, budget, seqs)
    if "graphs" in scenarios and ours.runner.cuda_steps is not None:
        from bench.lib.engine_graph_check import GraphCheck, without_mixed

        steps = ours.runner.cuda_steps
        every = dict(steps.prefill_graphs)
        # mixed first: the first burst after start pays kernel compiles on eager shapes (8B on an H100: 4,238
        # output tok/s, then 4,810 with the same graphs), which captured mixed graphs should have paid at start
        for label in ("mixed graphs", "small graphs", "mixed graphs", "small graphs"):
            content += 1
            steps.prefill_graphs = every if label == "mixed graphs" else without_mixed(every)
            check = (
                GraphCheck(steps)
                if label == "mixed graphs" and shape not in RESULTS.get("graph_check", {})
                else None
            )
            try:
                run(
                    ours,
                    f"{shape} burst {budget}:{seqs} {label}",
                    make(args.requests, content),
                    ceil,
                    cost,
                    args,
                )
            finally:
                if check is not None:
                    check.close()
                    RESULTS.setdefault("graph_check", {})[shape] = check.summary()
                    log(f"{shape} graph check: {json.dumps(check.summary())[:400]}")
        steps.prefill_graphs = every
    if "trace" in scenarios:  # a production trace's window at full length and real timing
        from bench.lib.trace_data import load, window

        start, seconds = (float(x) for x in args.trace_window.split(":"))
        rows = window(load(args.trace, Path(args.trace_dir)), start, seconds)
        rng = random.Random(seed)
        requests = [Request([rng.randrange(10, vocab) for _ in range(min(r.input_length, args.max_model_len - 2))],
                            max(1, min(r.output_length, args.max_model_len - r.input_length - 1)),
                            r.t_ms / 1e3) for r in rows]  # fmt: skip
        run(ours, f"{shape} {args.trace} {args.trace_window} {budget}:{seqs}", requests, ceil, cost, args)
    if "decode128" in scenarios:
        set_limits(ours, budget, max(seqs, 128))
        run(ours, f"{shape} decode128 {budget}", make(128, 900), ceil, cost, args)
        set_limits(ours, budget, seqs)
    if "breakdown" in scenarios and cuda:
        try:
            path = os.path.join(args.out, f"trace_{shape}.json")
            parts = profile_breakdown(ours.engine, make(128, 901), 0, args.profile_steps, path)
            os.remove(path)
            RESULTS.setdefault("breakdown", {})[shape] = parts
            log(f"{shape} breakdown: {json.dumps(parts)}")
        except Exception as error:  # keep the other figures
            log(f"{shape} breakdown failed: {error!r}")
    if "prefix" in scenarios:
        label = f"{shape} {args.kernels}".strip()
        RESULTS.setdefault("prefix", {})[label] = ttft = prefix_ttft(ours, vocab, seed=31)
        log(f"{shape} prefix TTFT: {json.dumps(ttft)}")
    ours.free()


def table() -> list[str]:
    head = (f"{'run':52s} {'out tok/s':>9s} {'total':>7s} {'bound%':>6s} {'TTFT p50/p90/p99 ms':>22s} "
            f"{'ITL p50/p90/p99 ms':>20s} {'good':>5s} {'dec x':>5s} {'mix ms':>6s} {'pre':>4s}")  # fmt: skip
    lines = ["", "=== engine_serving_gpu ===", f"device: {RESULTS['device']}  copy {RESULTS['copy_GBps']:.0f} GB/s"
             f"  bf16 matmul {RESULTS['matmul_TFLOPs']:.0f} TFLOP/s", head]  # fmt: skip
    for r in RESULTS["runs"]:
        t, i = r["ttft_ms"], r["itl_ms"]
        dec = r.get("decode", {}).get("gpu_over_floor_p50", float("nan"))
        mix = r.get("mixed", {}).get("gpu_ms_p50", float("nan"))
        lines.append(f"{r['label'][:52]:52s} {r['output_tok_s']:9.0f} {r['total_tok_s']:7.0f} "
                     f"{100 * r['share_of_bound']:6.1f} {t['p50']:6.0f}/{t['p90']:6.0f}/{t['p99']:6.0f} "
                     f"{i['p50']:5.1f}/{i['p90']:5.1f}/{i['p99']:6.1f} {r['goodput_share']:5.2f} {dec:5.2f} "
                     f"{mix:6.1f} {r['preemptions']:4d}")  # fmt: skip
    for shape, parts in RESULTS.get("breakdown", {}).items():
        for kind, part in parts.items():
            ms = ", ".join(f"{k} {v:.2f}" for k, v in part["ms_per_step"].items())
            lines.append(f"breakdown {shape} {kind} ({part['steps']} steps), ms/step: {ms}")
    for shape, ttft in RESULTS.get("prefix", {}).items():
        lines.append(f"prefix {shape}: cold {ttft['cold_ms']:.2f} ms, cached {ttft['cached_ms']:.2f} ms, "
                     f"{ttft['speedup']:.2f}x")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="llama-8b,llama-1b")
    parser.add_argument("--scenarios", default="burst,sweep,poisson,decode128,breakdown,prefix")
    parser.add_argument(
        "--configs",
        default="2048:256,4096:256,1024:256,2048:128",
        help="token budget : max running sequences; the first is the engine's for every scenario",
    )
    parser.add_argument(
        "--trace", default="azure_conv", help="trace scenario: a bench/lib/trace_data.py name"
    )
    parser.add_argument("--trace-dir", default="../shared/traces", help="where its file is")
    parser.add_argument("--trace-window", default="0:90", help="start:seconds of the trace")
    parser.add_argument("--ab-configs", default="2048:128", help="configs of the ab scenario")
    parser.add_argument("--rates", default="0.5,0.8,1.0", help="Poisson rates as fractions of burst req/s")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--poisson-requests", type=int, default=256)
    parser.add_argument("--kv-mb", type=int, default=56 * 1024)
    parser.add_argument("--max-model-len", type=int, default=2560)
    parser.add_argument("--slo-ttft", type=float, default=2.0, help="seconds")
    parser.add_argument("--slo-itl", type=float, default=0.1, help="seconds, mean inter-token latency")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--profile-steps", type=int, default=90)
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--quick", action="store_true", help="CPU dry run: tiny model, short prompts")
    parser.add_argument("--json", default="engine_serving_gpu.json", help="file name under --out")
    parser.add_argument("--kernels", default="", help="KernelSettings fields, name=value,...")
    parser.add_argument("--mixed-graphs", action="store_true", help="engine setting mixed_graphs on")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = parser.parse_args()
    from backends.local_engine.config import KernelSettings

    given = dict(item.split("=", 1) for item in args.kernels.split(",") if item)
    args.kernel_fields = KernelSettings(**given).model_dump(include=set(given))
    if args.quick:
        args.shapes, args.requests, args.poisson_requests, args.kv_mb = "tiny", 24, 12, 64
        args.configs, args.max_model_len, args.profile_steps = "64:8,32:8", 1200, 10
    cuda = torch.cuda.is_available()
    RESULTS["device"] = torch.cuda.get_device_name() if cuda else "cpu"
    RESULTS["args"] = vars(args)
    bw, flops = (copy_bandwidth(), matmul_peak()) if cuda else (50e9, 1e12)
    RESULTS["copy_GBps"], RESULTS["matmul_TFLOPs"] = bw / 1e9, flops / 1e12
    log(f"device {RESULTS['device']}: copy {bw / 1e9:.0f} GB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for shape in args.shapes.split(","):
        try:
            shape_section(shape, args, Ceilings(bw, flops))
        except Exception as error:  # keep the other shapes' numbers
            import traceback

            traceback.print_exc()
            RESULTS.setdefault("errors", {})[shape] = repr(error)
        sync()
        (Path(args.out) / args.json).write_text(json.dumps(RESULTS, indent=1))
    print("\n".join(table()), flush=True)


if __name__ == "__main__":
    main()
