"""Where a prefix-cached request's time to first token goes on the GPU (issue 17), per variant.

    python3 -m studies.engine_gpu_prefix [--shapes llama-8b,llama-1b] [--variants default,cublas] [--seqs 32,128]
        [--rounds 4] [--out studies/results]

bench/engine_gpu.py's measure (a 1024-token prefix cached, a new 32-token tail; cold: a new prefix each time)
split into its parts: the host before the prefill graph runs (request admission, prefix lookup, scheduling,
the input copy, the replay call), the wait for the first token (the graph and the sampler on the device), and
the host after it; beside them the (32 tokens, 2 sequences) prefill graph replayed alone (its device time)
and that graph's kernels under torch.profiler. A variant is a set of environment switches read when the
engine is built. JSON: --out/engine_gpu_prefix.json.
"""

import argparse
import gc
import json
import os
import statistics
import time
import types
from pathlib import Path

import torch

from backends.local_engine.engine import cuda_runner
from backends.local_engine.model import attention_cuda
from bench.engine_gpu import copy_bandwidth, prefix_ttft, ttft
from bench.lib.engine_gpu_models import build_hf, build_ours, random_prompts
from studies.engine_gpu_profile import kernel_table
from studies.gpu_timing import replay_ms

VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "cublas": {"LLMGW_SKINNY_ROWS": "1"},
    "nosplit": {"LLMGW_ATTENTION_SPLITS": "1"},
    "n64": {"LLMGW_ATTENTION_SPLIT_BLOCK_N": "64"},
}
SWITCHES = ("LLMGW_SKINNY_ROWS", "LLMGW_ATTENTION_SPLITS", "LLMGW_ATTENTION_SPLIT_BLOCK_N")


class Stamps:
    """Host time spent inside a few engine calls, summed per name."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.saved: list[tuple[object, str, object]] = []

    def wrap(self, owner: object, name: str, label: str) -> None:
        inner = getattr(owner, name)
        self.saved.append((owner, name, vars(owner).get(name)))

        def timed_call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.totals[label] = self.totals.get(label, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed_call)

    def restore(self) -> None:
        for owner, name, original in reversed(self.saved):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def host_split(ours, prefix: list[int], tails: list[list[int]]) -> dict:  # noqa: ANN001
    """Per cached request (median over `tails`), ms: total, add_request, schedule, runner (fill + replay
    call + logits copy queued), sample (the wait for the token), and the rest of the host."""
    engine = ours.engine
    stamps = Stamps()
    stamps.wrap(engine, "add_request", "add_request")
    stamps.wrap(engine.scheduler, "schedule", "schedule")
    stamps.wrap(engine.runner, "execute", "runner")
    stamps.wrap(engine, "_sample_fn", "sample")
    steps = engine.runner.cuda_steps
    stamps.wrap(steps.prefill_buffers, "fill", "runner.fill")
    stamps.wrap(cuda_runner, "host_step", "runner.host_step")
    graph, logits = steps.prefill_graphs[(32, 2)]
    replays = types.SimpleNamespace(replay=graph.replay)
    stamps.wrap(replays, "replay", "runner.replay")
    steps.prefill_graphs[(32, 2)] = (replays, logits)
    rows: dict[str, list[float]] = {}
    for tail in tails:
        stamps.totals.clear()
        total = ttft(ours, prefix + tail)
        parts = {"total": total, **stamps.totals}
        parts["rest"] = total - sum(v for k, v in stamps.totals.items() if "." not in k)
        for key, value in parts.items():
            rows.setdefault(key, []).append(1e3 * value)
    stamps.restore()
    steps.prefill_graphs[(32, 2)] = (graph, logits)
    return {key: statistics.median(values) for key, values in rows.items()}


def attention_sweep(tokens: int = 32, context: int = 1056, repeats: int = 32) -> dict:
    """The 8B layer's attention of a `tokens`-token tail over a `context`-token cached context (32 heads,
    8 KV heads, head_dim 128, bf16, 16-token pages in shuffled order) per (splits, block_m, block_n, warps,
    stages): us per call from a CUDA graph of `repeats` back-to-back calls, and the largest difference from
    the one-split result relative to its largest value."""
    import functools
    import itertools

    from backends.local_engine.kernels.triton.paged_attention import paged_attention

    heads, kv_heads, dim, page = 32, 8, 128, 16
    pages = -(-context // page)
    pool = torch.randn(2, 4 * pages * page, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(4 * pages, device="cuda")[:pages].to(torch.int32)[None, :]
    tables = torch.cat([table, torch.zeros_like(table)])  # a padding sequence, as the prefill graph has
    lens = torch.tensor([context, 0], dtype=torch.int32, device="cuda")
    starts = torch.tensor([0, tokens, tokens], dtype=torch.int32, device="cuda")
    q = torch.randn(tokens, heads, dim, device="cuda", dtype=torch.bfloat16)
    scale = dim**-0.5
    reference = paged_attention(q, pool, tables, page, lens, starts, scale).float()
    table_out: dict = {}
    for splits, block_m, block_n, warps, stages in itertools.product(
        (1, 2, 4, 8, 16), (16, 32, 64), (32, 64, 128), (4, 8), (2, 3)
    ):
        call = functools.partial(
            paged_attention, q, pool, tables, page, lens, starts, scale, num_splits=splits, block_m=block_m,
            block_n=block_n, num_warps=warps, num_stages=stages,
        )  # fmt: skip
        try:
            out = call().float()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(repeats):
                    call()
            us = 1e3 * replay_ms(graph, 20) / repeats
        except Exception as error:  # a config that does not compile or fit
            table_out[f"s{splits} m{block_m} n{block_n} w{warps} st{stages}"] = repr(error)[:80]
            continue
        err = float((out - reference).abs().max() / reference.abs().max())
        table_out[f"s{splits} m{block_m} n{block_n} w{warps} st{stages}"] = [round(us, 2), err]
    ranked = sorted((v[0], k, v[1]) for k, v in table_out.items() if isinstance(v, list))
    for us, key, err in ranked[:16]:
        print(f"  attention {key:<24} {us:7.2f} us  err {err:.1e}", flush=True)
    return table_out


def graph_kernels(graph: torch.cuda.CUDAGraph, replays: int = 5, count: int = 14) -> dict:
    """torch.profiler over `replays` replays of `graph`: its kernels by device time."""
    from torch.profiler import ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    total, launches, top = kernel_table(prof, replays, count, digits=1)
    return {"kernel_us": total, "kernels": launches, "top": top}


def measure(hf, shape: str, variant: str, seqs: int, rounds: int) -> dict:  # noqa: ANN001
    for name in SWITCHES:
        os.environ.pop(name, None)
    os.environ.update(VARIANTS[variant])
    attention_cuda._ACTIVE.clear()  # picked again, with this variant's switches
    ours = build_ours(hf, shape, "bf16", seqs, 16384 if "8b" in shape else 6144)
    vocab = hf.config.vocab_size
    row: dict = {"ttft": [prefix_ttft(ours, vocab, seed=21 + 2 * r) for r in range(rounds)]}  # new prefixes
    row["cached_ms_median"] = statistics.median(r["cached_ms"] for r in row["ttft"])
    row["cold_ms_median"] = statistics.median(r["cold_ms"] for r in row["ttft"])
    row["speedup_median"] = row["cold_ms_median"] / row["cached_ms_median"]
    prefix = random_prompts(1, 1024, 1024, vocab, 41)[0]
    tails = random_prompts(9, 32, 32, vocab, 42)
    ttft(ours, prefix + tails[0])
    row["host_split_ms"] = host_split(ours, prefix, tails[1:])
    graph = ours.runner.cuda_steps.prefill_graphs[(32, 2)][0]
    row["prefill_graph_ms"] = replay_ms(graph)
    row["graph_kernels"] = graph_kernels(graph)
    ours.free()
    gc.collect()
    torch.cuda.empty_cache()
    split = row["host_split_ms"]
    print(f"{shape:<9} {variant:<9} seqs {seqs:<4} cold {row['cold_ms_median']:6.2f} cached "
          f"{row['cached_ms_median']:5.2f} (x{row['speedup_median']:.2f})  graph {row['prefill_graph_ms']:.3f}  "
          + "  ".join(f"{k} {v:.3f}" for k, v in split.items())
          + f"  kernels {row['graph_kernels']['kernels']:.0f}", flush=True)  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="llama-8b,llama-1b")
    parser.add_argument("--variants", default="default,cublas")
    parser.add_argument("--seqs", default="32,128")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--attention-sweep", action="store_true", help="also time attention configs")
    parser.add_argument("--out", default="studies/results")
    args = parser.parse_args()
    results: dict = {"device": torch.cuda.get_device_name(), "copy_GBps": copy_bandwidth() / 1e9, "rows": {}}
    out = Path(args.out) / "engine_gpu_prefix.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.attention_sweep:
        try:
            results["attention_sweep"] = attention_sweep()
        except Exception as error:  # keep the engine rows
            results["attention_sweep"] = repr(error)
        out.write_text(json.dumps(results, indent=1))
    for shape in args.shapes.split(","):
        hf = build_hf(shape, torch.device("cuda"), torch.float32)
        for seqs in map(int, args.seqs.split(",")):
            for variant in args.variants.split(","):
                key = f"{shape} {variant} seqs={seqs}"
                try:
                    results["rows"][key] = measure(hf, shape, variant, seqs, args.rounds)
                except Exception as error:  # keep the other rows
                    import traceback

                    traceback.print_exc()
                    results["rows"][key] = {"error": repr(error)}
                out.write_text(json.dumps(results, indent=1))
        del hf
        gc.collect()
        torch.cuda.empty_cache()
    for key, row in results["rows"].items():
        for name, us, count in row.get("graph_kernels", {}).get("top", []):
            print(f"  {key:<28} {us:9.1f} us  x{count:<4} {name}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
