"""`llmgw plan`: capacity planning from a model shape (or a HF config.json), a GPU and a workload (issue 43).

    llmgw plan --shape 80,8,128 --params 70e9 --dtype fp16 --gpu H100 --gpus-per-replica 4 \\
        --rate 2 --input-mean 2000 --output-mean 300 --ttft-slo-ms 2000 --itl-slo-ms 50
    llmgw plan --config config.json --gpu H200 --trace ../shared/traces/mooncake_conversation_trace.jsonl
    llmgw plan ... --calibration bench/results/trace_replay_cpu.json   # a measured step-time model
    llmgw plan ... --sequence-tokens 8192                                 # the seed's sequences-that-fit

Prints JSON: KV bytes per token and per sequence, sequences that fit, the batch and decode step at the SLO,
the largest arrival rate per replica that meets it, the replicas needed, what limits them.
"""

import argparse
import json
from dataclasses import replace
from pathlib import Path

from routing.planning.capacity import (
    DTYPE_BYTES,
    GB,
    GPUS,
    Gpu,
    ModelShape,
    StepModel,
    Workload,
    plan,
    sequences_fit,
)
from routing.planning.workload import workload_from_trace


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    model = p.add_argument_group("model")
    model.add_argument("--config", type=Path, help="a HF config.json")
    model.add_argument("--shape", help="layers,kv_heads,head_dim (instead of --config)")
    model.add_argument("--params", type=float, default=0.0, help="parameter count (with --shape)")
    model.add_argument(
        "--weights-gb", type=float, help="the weights' measured size, instead of params x dtype"
    )
    model.add_argument(
        "--dtype", default=None, choices=sorted(DTYPE_BYTES), help="weights (default: config's, fp16)"
    )
    model.add_argument(
        "--kv-dtype", default=None, choices=sorted(DTYPE_BYTES), help="KV cache (default: as weights)"
    )
    gpu = p.add_argument_group("GPU")
    gpu.add_argument("--gpu", default="H100", choices=sorted(GPUS))
    gpu.add_argument("--gpu-memory-gb", type=float, help="instead of the GPU's datasheet memory (1e9 bytes)")
    gpu.add_argument("--gpu-bandwidth-tbs", type=float, help="instead of the datasheet bandwidth (TB/s)")
    gpu.add_argument("--gpus-per-replica", type=int, default=1)
    gpu.add_argument("--utilization", type=float, default=0.9, help="share of GPU memory the engine may use")
    work = p.add_argument_group("workload")
    work.add_argument("--trace", type=Path, help="Mooncake JSONL or Azure CSV")
    work.add_argument("--time-factor", type=float, default=1.0, help="stretch the trace's arrivals")
    work.add_argument("--length-div", type=float, default=1.0, help="divide the trace's lengths")
    work.add_argument("--rate", type=float, help="arrivals per second (without --trace)")
    work.add_argument("--input-mean", type=float, default=1000)
    work.add_argument("--input-p90", type=float)
    work.add_argument("--output-mean", type=float, default=200)
    work.add_argument(
        "--hit-rate", type=float, help="prefix-cache hit rate (default: the trace's bound, or 0)"
    )
    work.add_argument("--ttft-slo-ms", type=float, default=2000)
    work.add_argument("--itl-slo-ms", type=float, default=100)
    work.add_argument("--sequence-tokens", type=int, help="also: sequences of this length that fit")
    cal = p.add_argument_group("step-time model (default: roofline from the GPU)")
    cal.add_argument(
        "--calibration", type=Path, help="a bench/trace_replay.py results JSON (setup.calibration)"
    )
    cal.add_argument("--s-per-output-token", type=float, help="batch-1 decode step, seconds")
    cal.add_argument("--s-per-prompt-token", type=float, help="batch-1 prefill, seconds per token")
    cal.add_argument("--max-batch", type=int, default=256)
    return p


def build(args: argparse.Namespace) -> dict:
    if args.config:
        shape = ModelShape.from_hf_config(json.loads(args.config.read_text()), args.dtype, args.kv_dtype)
    elif args.shape:
        layers, kv_heads, head_dim = (int(x) for x in args.shape.split(","))
        weights = DTYPE_BYTES[args.dtype or "fp16"]
        kv = DTYPE_BYTES[args.kv_dtype] if args.kv_dtype else max(weights, 2.0)
        shape = ModelShape(layers, kv_heads, head_dim, kv, args.params, weights)
    else:
        raise SystemExit("llmgw plan: give --config or --shape")
    if args.weights_gb:
        shape = replace(shape, params=args.weights_gb * GB / shape.weight_dtype_bytes)
    base = GPUS[args.gpu]
    gpu = Gpu(
        args.gpu_memory_gb * GB if args.gpu_memory_gb else base.memory_bytes,
        args.gpu_bandwidth_tbs * 1e12 if args.gpu_bandwidth_tbs else base.bandwidth_bytes_s, base.flops,
    )  # fmt: skip
    ttft, itl = args.ttft_slo_ms / 1000, args.itl_slo_ms / 1000
    if args.trace:
        workload = workload_from_trace(
            args.trace, ttft, itl, args.time_factor, args.length_div, args.hit_rate
        )
    else:
        workload = Workload(args.rate or 1.0, args.input_mean, args.output_mean, args.input_p90 or args.input_mean,
                            args.hit_rate or 0.0, ttft, itl)  # fmt: skip
    roofline = StepModel.roofline(shape, gpu, args.gpus_per_replica)
    steps = roofline
    if args.calibration:
        measured = json.loads(args.calibration.read_text())["setup"]["calibration"]
        steps = StepModel.calibrated(measured["s_per_output_token"], measured["s_per_prompt_token"])
    elif args.s_per_output_token:
        steps = StepModel.calibrated(
            args.s_per_output_token, args.s_per_prompt_token or roofline.prefill_s_per_token
        )
    result = plan(
        shape, gpu.memory_bytes, steps, workload, args.gpus_per_replica, args.utilization, args.max_batch
    )
    out = {"model": shape.__dict__, "gpu": gpu.__dict__, "workload": workload.__dict__, "step_model": steps.__dict__,
           "plan": result.as_dict()}  # fmt: skip
    if args.sequence_tokens:
        memory = gpu.memory_bytes * args.gpus_per_replica
        out["sequences_of"] = {
            "tokens": args.sequence_tokens,
            "fit_all_memory": sequences_fit(memory, shape.weight_bytes, shape.kv_bytes_per_token, args.sequence_tokens),
            "fit_at_utilization": sequences_fit(memory, shape.weight_bytes, shape.kv_bytes_per_token,
                                                args.sequence_tokens, args.utilization),
        }  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    print(json.dumps(build(_parser().parse_args(argv)), indent=2))
    return 0
