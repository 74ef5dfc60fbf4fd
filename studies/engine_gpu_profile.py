"""Where a batch-1 decode step and a prefix-cached prefill step go on the GPU (issue 17), per variant.

    python3 -m studies.engine_gpu_profile [--shapes llama-8b,llama-1b] [--variants fused,unfused,...] [--out DIR]

A variant is a set of environment switches read when the engine is built (CUDA graphs are captured then):
  fused      the defaults: batch-1 layers in six kernels (norms, SwiGLU, residual adds inside the GEMVs),
             split-K attention for steps with few programs
  noswiglu   fused, but SwiGLU a kernel of its own (LLMGW_FUSED_GEMV=2)
  nosplit    fused, attention without split-K (LLMGW_ATTENTION_SPLITS=1)
  unfused    split-K attention, separate norm / SwiGLU / residual kernels (LLMGW_FUSED_GEMV=0)
  old        neither (the engine before both changes)
  sync       fused, but every decode step waits for its tokens (async_decode off; pipeline.py)
  int4fused  int4_mma layers in six kernels a layer too (LLMGW_INT4_FUSED=1: norms, SwiGLU and residual
             adds inside int4_mma.cu; model.int4_forward), for steps of up to 64 tokens
  int4pdl    int4_mma launched with programmatic dependent launch (LLMGW_INT4_PDL=1)
  int4both   int4fused and int4pdl together
  int4nosplit  int4both, attention without split-K
For each (shape, format, variant): batch-1 decode tok/s through the engine step beside the bucket-1 decode
graph replayed alone (its GPU time; the rest of a step is host work), the prefix TTFT (1024-token cached
prefix + 32 new tokens, bench/engine_gpu.py's measure) beside its prefill graph replayed alone, and the
top CUDA kernels of ten decode steps under torch.profiler. JSON goes to --out as engine_gpu_profile.json.
"""

import argparse
import gc
import json
import os
import statistics
from pathlib import Path

import torch

from bench.engine_gpu import batch1_decode, copy_bandwidth, prefix_ttft
from bench.lib.engine_gpu_models import build_hf, build_ours, decode_bytes
from studies.gpu_timing import SHAPES, replay_ms

VARIANTS = {
    "fused": {},
    "noswiglu": {"LLMGW_FUSED_GEMV": "2"},
    "nosplit": {"LLMGW_ATTENTION_SPLITS": "1"},
    "unfused": {"LLMGW_FUSED_GEMV": "0"},
    "old": {"LLMGW_FUSED_GEMV": "0", "LLMGW_ATTENTION_SPLITS": "1"},
    "sync": {},
    "tinygemm": {"LLMGW_INT4_KERNEL": "tinygemm"},
    "kernels": {"LLMGW_INT8_KERNEL": "kernels", "LLMGW_INT4_KERNEL": "kernels"},
    "int4fused": {"LLMGW_INT4_FUSED": "1"},
    "int4pdl": {"LLMGW_INT4_PDL": "1"},
    "int4both": {"LLMGW_INT4_FUSED": "1", "LLMGW_INT4_PDL": "1"},
    "int4nosplit": {"LLMGW_INT4_FUSED": "1", "LLMGW_INT4_PDL": "1", "LLMGW_ATTENTION_SPLITS": "1"},
}
SETTINGS = {"sync": {"async_decode": False}}  # engine settings a variant changes
SWITCHES = (
    "LLMGW_FUSED_GEMV",
    "LLMGW_ATTENTION_SPLITS",
    "LLMGW_INT4_KERNEL",
    "LLMGW_INT8_KERNEL",
    "LLMGW_INT4_FUSED",
    "LLMGW_INT4_PDL",
)


def skinny_matmuls(rows_list: tuple[int, ...] = (1, 8, 16, 32)) -> dict:
    """GB/s of cuBLAS (F.linear) and our kernels on the 8B projections at a few rows, weights rotated over
    copies that together exceed the L2: bf16 cuBLAS and GEMV, int8 (quant_triton.int8_matmul: the GEMV at
    one row), int4 on the Triton layout (int4_matmul) and on torch's tinygemm layout. Bytes are the weight's
    bytes (int4: nibbles + bf16 scale and min per group of 32). `do_bench` flushes the L2 before every call,
    so each call also pays its launch and a dirty-L2 write-back: these rates are below a forward pass's
    (studies/engine_gpu_skinny.py times back-to-back launches in a graph, as the engine runs them)."""
    import torch.nn.functional as F
    import triton.testing

    from backends.local_engine.kernels.quant import Int4Linear
    from backends.local_engine.kernels.quantize import quantize_int8
    from backends.local_engine.kernels.triton.gemv import gemv
    from backends.local_engine.kernels.triton.quant_own import int8_matmul

    shapes = SHAPES["llama-8b"]
    table: dict = {}

    def rate(fn, x: torch.Tensor, weights: list, nbytes: int) -> float:  # noqa: ANN001
        turn = iter(range(10**9))
        ms = triton.testing.do_bench(lambda: fn(x, weights[next(turn) % len(weights)]), return_mode="median")
        return nbytes / ms / 1e6

    def int4_layers(n: int, k: int, kernel: str, copies: int) -> list:
        os.environ["LLMGW_INT4_KERNEL"] = kernel
        layers = [Int4Linear(torch.randn(n, k, device="cuda") * 0.02, None, 32) for _ in range(copies)]
        os.environ.pop("LLMGW_INT4_KERNEL")
        return layers

    for name, (n, k) in shapes.items():
        copies = max(2, -(-400_000_000 // (n * k * 2)))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for rows in rows_list:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            table[f"{name} rows={rows} cublas GB/s"] = rate(F.linear, x, weights, n * k * 2)
            if rows == 1:
                table[f"{name} rows=1 gemv GB/s"] = rate(gemv, x, weights, n * k * 2)
        int8 = [quantize_int8(w.float()) for w in weights]
        del weights
        for rows in rows_list:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            table[f"{name} rows={rows} int8 GB/s"] = rate(lambda x, w: int8_matmul(x, *w), x, int8, n * k)
        del int8
        for kernel in ("triton", "tinygemm"):
            layers = int4_layers(n, k, kernel, max(2, -(-400_000_000 // (n * k * 5 // 8))))
            for rows in rows_list:
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                table[f"{name} rows={rows} int4 {kernel} GB/s"] = rate(
                    lambda x, w: w(x), x, layers, n * k * 5 // 8
                )
            del layers
        torch.cuda.empty_cache()
    for key, value in table.items():
        print(f"  {key:<36} {value:8.0f}")
    return table


def prefix_host_profile(ours, vocab: int, requests: int = 5) -> list[str]:  # noqa: ANN001
    """cProfile of `requests` prefix-cached TTFT requests (bench/engine_gpu.py's measure): the host's share."""
    import cProfile
    import io
    import pstats

    from bench.engine_gpu import random_prompts, ttft

    prefix = random_prompts(1, 1024, 1024, vocab, 31)[0]
    tails = random_prompts(requests + 1, 32, 32, vocab, 32)
    ttft(ours, prefix + tails[0])
    profiler = cProfile.Profile()
    profiler.enable()
    for tail in tails[1:]:
        ttft(ours, prefix + tail)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    return text.getvalue().splitlines()


def top_kernels(engine, steps: int = 10, count: int = 12) -> dict:
    """torch.profiler over `steps` decode steps of one request: kernels by total device time."""
    from torch.profiler import ProfilerActivity, profile

    from backends.local_engine.engine.sampling_params import SamplingParams

    engine.add_request(
        list(range(1, 129)), SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True)
    )
    engine.step()
    engine.step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
    while engine.has_work:
        engine.step()
    total, launches, top = kernel_table(prof, steps, count)
    return {"kernel_us_per_step": total, "kernels_per_step": launches, "top": top}


def kernel_table(prof, runs: int, count: int, digits: int = 2) -> tuple[float, float, list]:  # noqa: ANN001
    """From a torch.profiler run over `runs` repetitions: device us and kernel launches per repetition,
    and the `count` kernels with the most device time as [name, us per repetition, launches per one]."""
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    top = [[e.key[:70], round(e.device_time_total / runs, digits), e.count // runs] for e in events[:count]]
    return sum(e.device_time_total for e in events) / runs, sum(e.count for e in events) / runs, top


def measure(hf, shape: str, fmt: str, variant: str, bandwidth: float, max_seqs: int = 4) -> dict:
    for name in SWITCHES:
        os.environ.pop(name, None)
    os.environ.update(VARIANTS[variant])
    ours = build_ours(hf, shape, fmt, max_seqs, 8192 if "8b" in shape else 4096, **SETTINGS.get(variant, {}))
    vocab = hf.config.vocab_size
    steps = ours.runner.cuda_steps
    tok_s = statistics.median(batch1_decode(ours, vocab))
    graph_ms = replay_ms(steps.graphs[1][0])
    row = {
        "decode_tok_s": tok_s,
        "pct_roofline": 100 * tok_s * decode_bytes(ours.runner) / bandwidth,
        "step_ms": 1e3 / tok_s,
        "decode_graph_ms": graph_ms,
        "host_ms": 1e3 / tok_s - graph_ms,
    }
    if fmt == "bf16":
        row["prefix"] = prefix_ttft(ours, vocab)
        # the (32 tokens, 2 sequences) graph still holds the last cached request's inputs
        row["prefix"]["prefill_graph_ms"] = replay_ms(steps.prefill_graphs[(32, 2)][0])
        if os.environ.get("PREFIX_PROFILE"):
            row["prefix"]["host_profile"] = prefix_host_profile(ours, vocab)
            print("\n".join(row["prefix"]["host_profile"][:45]), flush=True)
    row["profile"] = top_kernels(ours.engine)
    ours.free()
    del ours
    gc.collect()
    torch.cuda.empty_cache()
    print(f"{shape:<9} {fmt:<5} {variant:<8} {tok_s:8.1f} tok/s {row['pct_roofline']:5.1f} %  step "
          f"{row['step_ms']:.3f} ms  graph {graph_ms:.3f} ms  host {row['host_ms']:.3f} ms  "
          f"kernels/step {row['profile']['kernels_per_step']:.0f}"
          + (f"  prefix cold {row['prefix']['cold_ms']:.2f} cached {row['prefix']['cached_ms']:.2f} "
             f"(x{row['prefix']['speedup']:.2f})" if "prefix" in row else ""), flush=True)  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="llama-8b,llama-1b")
    parser.add_argument("--variants", default="fused,noswiglu,unfused,old")
    parser.add_argument("--formats", default="bf16,int8")
    parser.add_argument("--int8-variants", default="fused,unfused")
    parser.add_argument("--int4-variants", default="fused,tinygemm")
    parser.add_argument("--max-seqs", type=int, default=4, help="engine max_num_seqs (decode graph buckets)")
    parser.add_argument("--matmuls", action="store_true", help="also time skinny matmuls of the 8B shapes")
    parser.add_argument("--out", default="studies/results")
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    results: dict = {"device": torch.cuda.get_device_name(), "copy_GBps": bandwidth / 1e9, "rows": {}}
    out = Path(args.out) / "engine_gpu_profile.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.matmuls:
        results["matmuls"] = skinny_matmuls()
    for shape in args.shapes.split(","):
        hf = build_hf(shape, torch.device("cuda"), torch.float32)
        for fmt in args.formats.split(","):
            variants = {"bf16": args.variants, "int8": args.int8_variants, "int4": args.int4_variants}[
                fmt
            ].split(",")
            for variant in variants:
                try:
                    results["rows"][f"{shape} {fmt} {variant}"] = measure(
                        hf, shape, fmt, variant, bandwidth, args.max_seqs
                    )
                except Exception as error:  # keep the other rows
                    import traceback

                    traceback.print_exc()
                    results["rows"][f"{shape} {fmt} {variant}"] = {"error": repr(error)}
                out.write_text(json.dumps(results, indent=1))
        del hf
        gc.collect()
        torch.cuda.empty_cache()
    for key, row in results["rows"].items():
        for name, us, count in row.get("profile", {}).get("top", [])[:8]:
            print(f"  {key:<24} {us:9.1f} us/step  x{count:<4} {name}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
