"""int4 kernels on the Llama-3 8B projections (issue 17: int4 at 8B batch 1): tinygemm, GemLite, ours.

    python3 -m studies.engine_gpu_int4_kernels [--rows 1,2,4,16] [--kinds tinygemm,mma,gemlite] [--configs] [--out DIR]

Every layer is built from the same weight: `quant.Int4Linear` (torch's tinygemm), `int4_mma.Int4MmaLinear`
(our tensor-core kernel) and, where the `gemlite` package is installed, `studies.int4_gemlite` (GemLite's
Triton kernels). Each is checked against the float64 product with the dequantized weight (relative error
of the whole output), then timed as a launch's share of a CUDA graph cycling through >= 512 MiB of weight
copies. With --configs, ours is also timed in each launch shape (`int4_mma.CONFIGS`) at <= 8 rows and the
best per weight shape printed as an LLMGW_INT4_MMA_CONFIGS value. Prints GB/s of the int4 bytes (codes + bf16 scale and min per group of 32); JSON:
engine_gpu_int4_kernels.json (the first run, tinygemm vs GemLite only: engine_gpu_int4_gemlite.json).
"""

import argparse
import json
import os
from pathlib import Path

import torch

from backends.local_engine.kernels.cuda.int4_mma import CONFIGS, Int4MmaLinear, config_for
from backends.local_engine.kernels.quant import Int4Linear
from backends.local_engine.kernels.quantize import dequantize_int4, quantize_int4
from studies.engine_gpu_int4_gemv import SHAPES
from studies.gpu_timing import graph_us

GROUP = 32


def build(kind: str, weight: torch.Tensor) -> torch.nn.Module:
    if kind == "tinygemm":
        os.environ["LLMGW_INT4_KERNEL"] = "tinygemm"
        return Int4Linear(weight, None, GROUP)
    if kind == "mma":
        return Int4MmaLinear(weight, None, GROUP)
    from studies.int4_gemlite import GemliteInt4Linear

    return GemliteInt4Linear(weight, None, GROUP)


def rel_err(layer: torch.nn.Module, weight: torch.Tensor, rows: int) -> float:
    q, scales_and_zeros = quantize_int4(weight.float(), GROUP)
    dense = dequantize_int4(q, scales_and_zeros, GROUP).double()
    x = torch.randn(rows, weight.shape[1], device=weight.device).bfloat16()
    exact = x.double() @ dense.t()
    return float((layer(x).double() - exact).norm() / exact.norm())


def measure(name: str, n: int, k: int, rows: list[int], kinds: list[str], configs: bool) -> dict:
    weight = torch.randn(n, k, device="cuda") * 0.02
    nbytes = n * k // 2 + 2 * 2 * n * (k // GROUP)
    count = max(2, -(-512 * 2**20 // nbytes))
    layers = {kind: [build(kind, weight) for _ in range(count)] for kind in kinds}
    row: dict = {"bytes": nbytes}
    for m in rows:
        x = torch.randn(m, k, device="cuda").bfloat16()
        for kind, copies in layers.items():
            row[f"{kind} m{m} us"] = graph_us(
                lambda i, c=copies, x=x: c[i](x), list(range(count)), max(count, 8)
            )
        speeds = "  ".join(f"{kind} {nbytes / row[f'{kind} m{m} us'] / 1e3:6.0f}" for kind in kinds)
        if configs and "mma" in layers and m <= 8:
            for config in CONFIGS:
                for layer in layers["mma"]:
                    layer.config = config
                key = f"mma config{config} m{m} us"
                row[key] = graph_us(
                    lambda i, c=layers["mma"], x=x: c[i](x), list(range(count)), max(count, 8)
                )
                speeds += f"  c{config} {nbytes / row[key] / 1e3:5.0f}"
            for layer in layers["mma"]:
                layer.config = config_for(n, k)
        print(f"{name:<8} {n:>6}x{k:<6} rows {m:>3}  GB/s: {speeds}", flush=True)
    for kind, copies in layers.items():  # exactness on the full layer, fresh inputs
        row[f"{kind} rel_err"] = max(rel_err(copies[0], weight, m) for m in (*rows, 100))
    del layers
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,16")
    parser.add_argument("--kinds", default="tinygemm,mma,gemlite")
    parser.add_argument("--configs", action="store_true", help="time each launch shape of ours at <= 8 rows")
    parser.add_argument("--out", default=os.environ.get("OUT", "studies/results"))
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    kinds = [kind for kind in args.kinds.split(",") if kind != "gemlite" or _has_gemlite()]
    torch.manual_seed(0)
    results: dict = {"device": torch.cuda.get_device_name(), "rows": {}}
    for name, (n, k) in SHAPES.items():
        if name != "lm_head":  # int4 keeps the output layer in int8
            results["rows"][name] = measure(name, n, k, rows, kinds, args.configs)
    first = results["rows"]["qkv"]
    results["per_layer_us"] = {
        key: sum(r[key] for r in results["rows"].values()) for key in first if "us" in key
    }
    print("summed over the four projections of a layer, µs:")
    for m in rows:
        print(
            f"  rows {m:>3}: "
            + "  ".join(f"{kind} {results['per_layer_us'][f'{kind} m{m} us']:7.1f}" for kind in kinds)
        )
    if args.configs:
        best = {
            name: min(CONFIGS, key=lambda c, r=r: r.get(f"mma config{c} m{rows[0]} us", 1e9))
            for name, r in results["rows"].items()
        }
        results["best_configs"] = ",".join(
            f"{n}x{k}:{best[name]}" for name, (n, k) in SHAPES.items() if name in best
        )
        print(f"fastest launch shapes at {rows[0]} rows: LLMGW_INT4_MMA_CONFIGS={results['best_configs']}")
    print(
        "relative errors:",
        {n: [round(r[f"{kind} rel_err"], 5) for kind in kinds] for n, r in results["rows"].items()},
    )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "engine_gpu_int4_kernels.json").write_text(json.dumps(results, indent=1))


def _has_gemlite() -> bool:
    try:
        import gemlite  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
