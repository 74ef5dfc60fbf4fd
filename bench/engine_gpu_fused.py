"""The fused 2-64 token layer (model.py `skinny_forward`) priced per projection on the GPU (issue 17).

    python3 -m bench.engine_gpu_fused [--rows 32,8] [--shapes llama-8b,llama-1b] [--out DIR]

For each Llama-3 projection and row count, three ways to compute what a layer needs, each timed as one
launch's share of a CUDA graph of back-to-back launches cycling through weight copies of >= 512 MiB
(bench/engine_gpu_skinny.graph_us):
  unfused  the engine's path before: add_rms_norm (Triton) then the matmul the table picks (skinny or
           cuBLAS) for qkv / gate_up; the matmul then the residual add for o / down
  fused    skinny_matmul with the norm, or the residual, inside (skinny_triton.fused_config's tiles)
  best     the fastest of the unsplit candidate tiles with the same fusion (is fused_config's pick good?)
Outputs are checked against float64 (relative error). JSON: engine_gpu_fused.json in --out.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from backends.local_engine import skinny_triton as sk
from backends.local_engine.fused_triton import add_rms_norm
from bench.engine_gpu_skinny import BASE, SHAPES, fits, graph_us, rotated

FUSIONS = {"qkv": "norm", "o": "residual", "gate_up": "norm", "down": "residual"}


def unfused_call(x, w, norm, residual, rows: int):  # noqa: ANN001, ANN201
    """What the engine ran before skinny_forward."""
    if norm is not None:
        x = add_rms_norm(x, None, norm, 1e-5)[0]
    config = sk.config_for(rows, *w.shape)
    out = sk.skinny_matmul(x, w, config) if config is not None else F.linear(x, w)
    return out if residual is None else out + residual


def measure(name: str, n: int, k: int, rows: int) -> dict:
    weights, calls = rotated(n, k)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    fused_kind = FUSIONS[name]
    norm = (1 + 0.1 * torch.randn(k, device="cuda")).bfloat16() if fused_kind == "norm" else None
    residual = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) if fused_kind == "residual" else None
    inputs = x.double()
    if norm is not None:
        inputs = inputs * torch.rsqrt(inputs.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.double()
    exact = inputs @ weights[0].double().T + (0.0 if residual is None else residual.double())

    def fused(w, config):  # noqa: ANN001, ANN202
        return sk.skinny_matmul(x, w, config, norm=norm, eps=1e-5, residual=residual)

    def rel(out) -> float:  # noqa: ANN001
        return float((out.double() - exact).norm() / exact.norm())

    chosen = sk.fused_config(rows, n, k)
    row = {
        "unfused_us": graph_us(lambda w: unfused_call(x, w, norm, residual, rows), weights, calls),
        "fused_us": graph_us(lambda w: fused(w, chosen), weights, calls),
        "fused_config": list(chosen), "fused_rel_err": rel(fused(weights[0], chosen)),
        "unfused_rel_err": rel(unfused_call(x, weights[0], norm, residual, rows)), "candidates": {},
    }  # fmt: skip
    bm = sk.row_bucket(rows)
    for base in BASE:
        if fits(base, bm) and base[0] * 8 <= n:
            config = sk.SkinnyConfig(*base, split=1, block_m=bm)
            try:
                row["candidates"][str(tuple(config))] = graph_us(
                    lambda w, c=config: fused(w, c), weights, calls
                )
            except Exception as error:  # noqa: BLE001 (a tile that does not compile)
                row["candidates"][str(tuple(config))] = repr(error)[:120]
    timed = {c: us for c, us in row["candidates"].items() if isinstance(us, float)}
    row["best_config"] = min(timed, key=timed.get) if timed else None
    row["best_us"] = timed[row["best_config"]] if timed else None
    del weights
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="32,8")
    parser.add_argument("--shapes", default="llama-8b,llama-1b")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = parser.parse_args()
    results: dict = {"device": torch.cuda.get_device_name(), "rows": {}}
    out = Path(args.out) / "engine_gpu_fused.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{'projection':<22} {'unfused us':>10} {'fused us':>9} {'best us':>8}  fused rel err  best config")
    for shape in args.shapes.split(","):
        for name, (n, k) in SHAPES[shape].items():
            if name not in FUSIONS:
                continue
            for rows in map(int, args.rows.split(",")):
                key = f"{shape} {name} rows={rows}"
                row = results["rows"][key] = measure(name, n, k, rows)
                out.write_text(json.dumps(results, indent=1))
                print(f"{key:<22} {row['unfused_us']:10.2f} {row['fused_us']:9.2f} {row['best_us'] or 0:8.2f}"
                      f"  {row['fused_rel_err']:.2e}      {row['best_config']}", flush=True)  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
