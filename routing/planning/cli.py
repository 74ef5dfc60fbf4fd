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
from pathlib import Path

from pydantic import ValidationError

from routing.planning.capacity import DTYPE_BYTES, GPUS
from routing.planning.request import PlanRequest, answer
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
    cal.add_argument("--capacity-rps", type=float,
                     help="a serving unit's closed-loop request rate measured on this workload (a replica, or the "
                          "engines sharing one GPU); replaces the step model's service time in the queueing")  # fmt: skip
    cal.add_argument("--unloaded-ttft-p90-ms", type=float, help="its p90 TTFT measured at low load")
    return p


def build(args: argparse.Namespace) -> dict:
    """The flags as a PlanRequest (the admin route's body), plus what only a shell has: files."""
    fields = {k: v for k, v in vars(args).items() if k in PlanRequest.model_fields and v is not None}
    if args.calibration:  # batch-1 step times measured by bench/trace_replay.py (flags given win)
        measured = json.loads(args.calibration.read_text())["setup"]["calibration"]
        fields = {"s_per_output_token": measured["s_per_output_token"],
                  "s_per_prompt_token": measured["s_per_prompt_token"], **fields}  # fmt: skip
    if args.config:
        fields["config"] = json.loads(args.config.read_text())
    if args.shape:
        layers, kv_heads, head_dim = (int(x) for x in args.shape.split(","))
        fields["shape"] = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim}
    if not args.config and not args.shape:
        raise SystemExit("llmgw plan: give --config or --shape")
    try:
        request = PlanRequest.model_validate(fields)
    except ValidationError as error:
        raise SystemExit(f"llmgw plan: {error}") from None
    workload = None
    if args.trace:
        workload = workload_from_trace(args.trace, request.ttft_slo_ms / 1000, request.itl_slo_ms / 1000,
                                       args.time_factor, args.length_div, args.hit_rate)  # fmt: skip
    return answer(request, workload)


def main(argv: list[str]) -> int:
    print(json.dumps(build(_parser().parse_args(argv)), indent=2))
    return 0
