"""Quantized matmul kernels on this CPU: time per step of SmolLM2-135M's linear layers at 1-32 rows.

For each candidate kernel and row count, one "step" runs every linear layer of the model once (30 layers of
qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536, on distinct weights so they are cache-cold as in
a real step) plus, separately, the 49152x576 output layer. Medians of `--repeats`.

    .venv/bin/python -m studies.engine_matmul [--rows 1,4,8,16,32] [--threads 1] [--repeats 7]

Prints a table (ms per step and ms per row) and writes studies/results/engine_matmul.json. The engine's
quant.py picks its kernels from these figures ("engine int4" is cpu_kernels.py's AVX2 kernel where it builds).
"""

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from backends.local_engine.kernels.cpu.ops import Int8CpuLinear
from backends.local_engine.kernels.quant import Int4Linear
from backends.local_engine.kernels.select import make_linear
from studies import RESULTS

LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
HEAD_SHAPE = (49152, 576)
NUM_LAYERS = 30


def _fbgemm(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Dynamic int8 (activations quantized per call) through fbgemm's packed weights."""
    q, scale = _per_channel_int8(weight)
    qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros_like(scale).long(), 0)
    packed = torch.ops.quantized.linear_prepack(qweight, None)
    return lambda x: torch.ops.quantized.linear_dynamic(x, packed, True)


def _per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    return torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def _int8pack(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    q, scale = _per_channel_int8(weight)
    scale_bf16 = scale.bfloat16()
    return lambda x: torch._weight_int8pack_mm(x.bfloat16(), q, scale_bf16).float()


def _int4pack(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    layer = Int4Linear(weight, None, 32)  # torch's packed layout, whatever make_linear picks
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.bfloat16(), layer.packed, 32, layer.scales_and_zeros_bf16
    ).float()


def _dense(dtype: torch.dtype) -> Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    def build(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        w = weight.to(dtype)
        return lambda x: F.linear(x.to(dtype), w).float()

    return build


def _engine(dtype: str) -> Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    def build(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        return make_linear(weight, None, dtype, 32)

    return build


CANDIDATES: dict[str, Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {
    "fp32 F.linear": _dense(torch.float32),
    "bf16 F.linear": _dense(torch.bfloat16),
    "int8 _weight_int8pack_mm": _int8pack,
    "int8 fbgemm linear_dynamic (7-bit per-tensor activations)": _fbgemm,
    "int4 _weight_int4pack_mm_for_cpu": _int4pack,
    "engine fp16 (quant.py)": _engine("fp16"),
    "engine int8 (quant.py)": _engine("int8"),
    "engine int4 (quant.py)": _engine("int4"),
    "int8 AVX2 (cpu_kernels.py; the int4 format's output layer)": Int8CpuLinear,
}


def time_step(
    fns: list[Callable[[torch.Tensor], torch.Tensor]], xs: list[torch.Tensor], repeats: int
) -> float:
    for fn, x in zip(fns, xs, strict=True):  # warm-up
        fn(x)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.inference_mode():
            for fn, x in zip(fns, xs, strict=True):
                fn(x)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1,4,8,16,32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", default="", help="comma-separated candidate names (substring match)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows_list = [int(r) for r in args.rows.split(",")]
    layer_weights = [torch.randn(shape) * 0.05 for _ in range(NUM_LAYERS) for shape in LAYER_SHAPES]
    head_weight = torch.randn(HEAD_SHAPE) * 0.05
    names = [n for n in CANDIDATES if not args.only or any(o in n for o in args.only.split(","))]
    results = []
    print(f"load {os.getloadavg()[0]:.2f}, threads {args.threads}")
    print(f"{'kernel':<58} {'rows':>4} {'layers ms':>9} {'ms/row':>7} {'head ms':>8} {'ms/row':>7}")
    for name in names:
        fns = [CANDIDATES[name](w) for w in layer_weights]
        head = CANDIDATES[name](head_weight)
        for rows in rows_list:
            xs = [torch.randn(rows, w.shape[1]) for w in layer_weights]
            layers_ms = time_step(fns, xs, args.repeats)
            head_ms = time_step([head], [torch.randn(rows, HEAD_SHAPE[1])], args.repeats)
            results.append({"kernel": name, "rows": rows, "layers_ms": layers_ms, "head_ms": head_ms})
            print(f"{name:<58} {rows:>4} {layers_ms:>9.1f} {layers_ms / rows:>7.2f} {head_ms:>8.2f} "
                  f"{head_ms / rows:>7.2f}", flush=True)  # fmt: skip
        del fns, head
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {"threads": args.threads, "load_start": os.getloadavg(), "results": results}
    (RESULTS / f"engine_matmul_t{args.threads}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
