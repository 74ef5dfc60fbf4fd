"""`engine_gpu triton`: the kernels/ package's Triton kernels on a GPU: time, bandwidth and % of measured copy
bandwidth.

    python -m bench.engine_gpu triton [--shape 8b|1b] [--sweep]    # CUDA
    python -m bench.engine_gpu triton --dry-run                     # CPU: tiny shapes through the interpreter

Measures device-to-device copy bandwidth first (the roofline), then per Llama-3 linear shape and row
count M: bf16 cuBLAS (F.linear), int8_matmul, int4_matmul (G = 32 and 128, bf16 scales), each checked
against its torch reference (max error relative to the output's max); with --sweep also a few
alternative MatmulConfigs around choose_config's pick (the best is printed beside the default). Then
paged decode at batch 1 / 32 / 128 and 1k / 4k contexts (split-K by choose_num_splits vs none) and one
mixed prefill + decode step; then the serving shapes of bench/lib/engine_kernels_serving.py (ragged decode
at 128 / 256 sequences, prefill chunks against SDPA's FlashAttention). Bytes are the minimum a call must move (formats.matmul_bytes_flops,
paged_attention.attention_flops_bytes). Prints a table and writes bench/results/engine_kernels_<shape>.json (not in --dry-run).
"""

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"
    import tests.triton_interpreter_support  # noqa: F401  (interpreter shims)

import torch
import torch.nn.functional as F

from backends.local_engine.kernels.quantize import quantize_int8
from backends.local_engine.kernels.triton import formats, reference
from bench.lib import engine_kernels_serving as serving
from bench.lib.harness import write_json

attention = importlib.import_module(
    "backends.local_engine.kernels.triton.paged_attention"
)  # the package re-exports
matmul = importlib.import_module(
    "backends.local_engine.kernels.triton.quant_matmul"
)  # functions of the same names

SHAPES = {  # name: (N, K) of each linear layer of a Llama-3 shape, plus the output layer
    "8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
           "lm_head": (128256, 4096)},
    "1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
           "lm_head": (128256, 2048)},
    "dry": {"qkv": (96, 64), "down": (64, 128)},
}  # fmt: skip
HEADS = {"8b": (32, 8, 128), "1b": (32, 8, 64), "dry": (4, 2, 32)}


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds per call: triton's do_bench (L2 flushed between calls) on CUDA, one wall-clock call on CPU."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=50) / 1e3
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write)."""
    size = (1 << 30) if device.type == "cuda" else (1 << 20)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * size / timed(lambda: dst.copy_(src), device)


def rel_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.float() - expected.float()).abs().max() / expected.float().abs().max().clamp(min=1e-30))


def matmul_rows(
    shape: str, rows: list[int], sweep: bool, device: torch.device, bandwidth: float
) -> list[dict]:
    out: list[dict] = []
    for layer, (n, k) in SHAPES[shape].items():
        weight = torch.randn(n, k, device=device) * 0.02
        dense = weight.bfloat16()
        q8, scale8 = quantize_int8(weight)
        int4 = {g: formats.quantize_int4_packed(weight, g) for g in (32, 128) if k % g == 0}
        del weight
        for m in rows:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            nbytes = formats.matmul_bytes_flops(m, n, k, 16, 0, 0, 2)[0]
            seconds = timed(partial(F.linear, x, dense), device)
            out.append(_row(f"{layer} m={m}", "bf16 cublas", seconds, nbytes, bandwidth, None, None))
            # name: (kernel, its weight arguments, reference, (weight bits, group size, scale bytes))
            cases = {"int8": (matmul.int8_matmul, (q8, scale8), reference.reference_int8_matmul, (8, 0, 4))}
            for g, (packed, sz) in int4.items():
                cases[f"int4 g{g}"] = (
                    matmul.int4_matmul,
                    (packed, sz, g),
                    reference.reference_int4_matmul,
                    (4, g, 2),
                )
            for name, (kernel, weights, ref, (bits, group, scale_bytes)) in cases.items():
                nbytes = formats.matmul_bytes_flops(m, n, k, bits, group, scale_bytes, 2)[0]
                out += _matmul_configs(f"{layer} m={m}", name, partial(kernel, x, *weights), ref(x, *weights),
                                       (n, k, group), sweep, device, (nbytes, bandwidth))  # fmt: skip
    return out


def _matmul_configs(
    case: str, name: str, run: Callable[..., torch.Tensor], expected: torch.Tensor, shape: tuple[int, int, int],
    sweep: bool, device: torch.device, traffic: tuple[int, float],
) -> list[dict]:  # fmt: skip
    """choose_config's pick (checked against the reference), and with `sweep` the fastest neighbour."""
    n, k, group = shape
    config = matmul.choose_config(expected.shape[0], n, k, matmul.sm_count(device), group)
    error = rel_error(run(config=config), expected)
    best = (timed(partial(run, config=config), device), config)
    rows = [_row(case, name, best[0], *traffic, config, error)]
    if not sweep:
        return rows
    for candidate in _variants(config, group):
        try:
            best = min(
                best, (timed(partial(run, config=candidate), device), candidate), key=lambda pair: pair[0]
            )
        except Exception as failure:  # a tile the compiler refuses: skip it, say so
            print(f"  {case} {name} {candidate}: {type(failure).__name__}", file=sys.stderr)
    return rows + [_row(case, name + " best", best[0], *traffic, best[1], None)]


def _variants(config: matmul.MatmulConfig, group: int) -> list[matmul.MatmulConfig]:
    """A handful of neighbours of a config: N tile, K step, split-K, warps, pipeline depth."""
    block_k = [max(group, config.block_k // 2), config.block_k * 2]
    candidates = [replace(config, block_n=bn) for bn in (config.block_n // 2, config.block_n * 2) if bn >= 8]
    candidates += [replace(config, block_k=bk) for bk in block_k if bk >= max(16, group)]
    candidates += [replace(config, split_k=s) for s in (max(1, config.split_k // 2), config.split_k * 2)]
    candidates += [replace(config, num_warps=w) for w in (2, 8) if w != config.num_warps]
    candidates += [replace(config, num_stages=stages) for stages in (1, 4) if stages != config.num_stages]
    return [c for c in candidates if c != config]


def _row(case: str, kernel: str, seconds: float, nbytes: int, bandwidth: float,
         config: matmul.MatmulConfig | None, error: float | None) -> dict:  # fmt: skip
    return {
        "case": case, "kernel": kernel, "us": seconds * 1e6, "GB/s": nbytes / seconds / 1e9,
        "pct_copy_bw": 100 * nbytes / seconds / bandwidth, "config": asdict(config) if config else None,
        "rel_error": error,
    }  # fmt: skip


def attention_rows(shape: str, device: torch.device, bandwidth: float) -> list[dict]:
    heads, kv_heads, dim = HEADS[shape]
    block = 16
    cases = [(b, c) for b in (1, 32, 128) for c in (1024, 4096)] if shape != "dry" else [(1, 40), (3, 70)]
    out = []
    for batch, context in cases:
        blocks = -(-context // block)
        pool = torch.randn(2, batch * blocks * block, kv_heads, dim, device=device, dtype=torch.bfloat16)
        tables = torch.randperm(batch * blocks, device=device).view(batch, blocks).int()
        lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        q = torch.randn(batch, heads, dim, device=device, dtype=torch.bfloat16)
        starts = torch.arange(batch + 1, dtype=torch.int32, device=device)
        expected = reference.reference_paged_attention(q, pool, tables, block, lens, starts, dim**-0.5)
        flops, nbytes = attention.attention_flops_bytes(
            [1] * batch, [context] * batch, heads, kv_heads, dim, 2
        )
        for splits in sorted(
            {1, attention.choose_num_splits(batch, kv_heads, context, matmul.sm_count(device))}
        ):
            run = partial(attention.paged_decode, q, pool, tables, block, lens, dim**-0.5, num_splits=splits)
            error = rel_error(run(), expected)
            row = _row(f"decode b={batch} ctx={context}", f"paged_decode splits={splits}", timed(run, device),
                       nbytes, bandwidth, None, error)  # fmt: skip
            out.append(row | {"TFLOP/s": flops / (row["us"] * 1e-6) / 1e12})
    return out + [_mixed_step(heads, kv_heads, dim, device, bandwidth, shape)]


def _mixed_step(
    heads: int, kv_heads: int, dim: int, device: torch.device, bandwidth: float, shape: str
) -> dict:
    """4 prefill chunks of 512 new tokens (after 0/512/1024/1536 cached) + 60 decodes at 1k context."""
    q_lens = [512, 512, 512, 512] + [1] * 60 if shape != "dry" else [9, 1, 1]
    contexts = [512, 1024, 1536, 2048] + [1024] * 60 if shape != "dry" else [20, 30, 7]
    block = 16
    spans = [(c - n, n) for n, c in zip(q_lens, contexts, strict=True)]
    q, pool, tables, lens, starts = serving.paged_case(spans, heads, kv_heads, dim, device, block=block)
    run = partial(attention.paged_attention, q, pool, tables, block, lens, starts, dim**-0.5)
    error = rel_error(
        run(), reference.reference_paged_attention(q, pool, tables, block, lens, starts, dim**-0.5)
    )
    flops, nbytes = attention.attention_flops_bytes(q_lens, contexts, heads, kv_heads, dim, 2)
    row = _row("mixed step", "paged_attention", timed(run, device), nbytes, bandwidth, None, error)
    return row | {"TFLOP/s": flops / (row["us"] * 1e-6) / 1e12}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="engine_gpu triton", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["8b", "1b"], default="8b")
    parser.add_argument("--rows", default="1,16,128,2048")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.dry_run else "cuda")
    shape = "dry" if args.dry_run else args.shape
    rows = [1, 5] if args.dry_run else [int(r) for r in args.rows.split(",")]
    torch.manual_seed(0)
    bandwidth = copy_bandwidth(device)
    results = matmul_rows(shape, rows, args.sweep, device, bandwidth) + attention_rows(
        shape, device, bandwidth
    )
    kernels = (attention, timed, _row)
    results += serving.decode_rows(shape, HEADS[shape], device, bandwidth, kernels)
    rate = serving.matmul_rate(device, timed)
    prefill = serving.prefill_rows(shape, HEADS[shape], device, rate, kernels)
    print(
        f"copy bandwidth {bandwidth / 1e9:.0f} GB/s ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'})"
    )
    print(f"{'case':24} {'kernel':28} {'us':>9} {'GB/s':>7} {'% bw':>6} {'rel err':>8}  config")
    for r in results:
        error = "" if r["rel_error"] is None else f"{r['rel_error']:.1e}"
        config = "" if r["config"] is None else " ".join(f"{v}" for v in r["config"].values())
        print(
            f"{r['case']:24} {r['kernel']:28} {r['us']:9.1f} {r['GB/s']:7.0f} {r['pct_copy_bw']:6.1f} {error:>8}  {config}"
        )
    print(f"\nprefill chunks of a step: bf16 matmul rate {rate / 1e12:.0f} TFLOP/s")
    print(f"{'case':30} {'kernel':28} {'us':>9} {'TFLOP/s':>8} {'% mm':>6} {'rel err':>8}")
    for r in prefill:
        print(f"{r['case']:30} {r['kernel']:28} {r['us']:9.1f} {r['TFLOP/s']:8.1f} {r['pct_matmul_rate']:6.1f} "
              f"{r['rel_error']:8.1e}")  # fmt: skip
    if not args.dry_run:
        payload = {
            "copy_bandwidth_GBps": bandwidth / 1e9,
            "matmul_TFLOPs": rate / 1e12,
            "shape": shape,
            "sweep": args.sweep,
            "rows": results,
            "prefill": prefill,
        }
        print(f"wrote {write_json(f'engine_kernels_{shape}', payload)}")
