"""The skinny bf16 matmul (backends/local_engine/kernels/triton/skinny.py) against cuBLAS on the H200 (issue 17).

    python3 -m studies.engine_gpu_skinny [--rows 32,2,8,16,64] [--engine llama-1b,llama-8b] [--out DIR]

1. Sweep: for each Llama-3 8B / 1B projection (qkv, o, gate_up, down, lm_head) and each row count, F.linear
   (cuBLAS) and every candidate tile config (and K split) of the Triton kernel. A time is one launch's share
   of a CUDA graph of back-to-back launches that cycle through copies of the weight totalling >= 512 MB
   (8x the L2), so every launch reads its weight from HBM as in a forward pass; median of 7 replays. Every
   config's output is checked against a float64 product (relative error, and every element within one bf16
   step of it); split configs must give the same bits on a second run. GB/s counts the weight's bytes.
2. Table: per (row bucket, N, K) the config with the least summed time over the bucket's row counts, kept
   only where it beats cuBLAS's sum by >= 3 %; its times and cuBLAS's are measured again after the sweep
   (the winner of many noisy draws reads low). The table is printed as Python for skinny_triton._TABLE.
3. Engine A/B with that table installed: cuBLAS (LLMGW_SKINNY_ROWS=1) against the kernel (=64), alternating,
   per shape: prefix TTFT (bench/engine_gpu.prefix_ttft: 1024-token cached prefix + 32 new tokens) and its
   (32 tokens, 2 sequences) prefill graph alone, decode graphs of 2/8/32 sequences alone, closed-loop decode
   tok/s at 8 and 32 clients, and bf16 teacher-forced logits against transformers' fp32 ones.
JSON: engine_gpu_skinny.json in --out.
"""

import argparse
import ast
import gc
import json
import multiprocessing
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from backends.local_engine.kernels.triton import skinny as sk
from studies.gpu_timing import SHAPES, graph_us, replay_ms

BASE = [  # (BLOCK_N, BLOCK_K, warps, stages)
    (16, 256, 1, 4), (16, 256, 2, 4), (16, 512, 2, 3), (16, 512, 2, 4), (16, 1024, 4, 3),
    (32, 128, 2, 5), (32, 256, 2, 4), (32, 256, 4, 4), (32, 256, 4, 6), (32, 512, 4, 3), (32, 512, 4, 4),
    (64, 64, 4, 6), (64, 128, 4, 4), (64, 128, 4, 6), (64, 256, 4, 3), (64, 256, 4, 4), (64, 128, 8, 4),
    (64, 256, 8, 4), (128, 64, 4, 4), (128, 64, 4, 6), (128, 128, 4, 3), (128, 128, 4, 4), (128, 128, 8, 4),
    (128, 256, 8, 3), (256, 64, 8, 4), (256, 128, 8, 3),
]  # fmt: skip
_T0 = time.perf_counter()


def log(text: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f}s] {text}", flush=True)


def block_ms(rows: int) -> list[int]:
    return [8, 16] if rows <= 8 else [sk.row_bucket(rows)]


def fits(base: tuple, bm: int) -> bool:
    bn, bk, _, stages = base
    return (stages - 1) * (bn + bm) * bk * 2 <= 200 * 1024


PREVIOUS: dict = {}  # an earlier sweep's rows (--previous): candidates are its best configs, with and without PDL
TOP = [4]  # with PREVIOUS: how many of its best configs per row count


def candidates(rows: int, n: int, k: int) -> list[sk.SkinnyConfig]:
    if PREVIOUS:
        return previous_best(rows, n, k, TOP[0])
    out = []
    for bm in block_ms(rows):
        for base in BASE:
            blocks = -(-n // base[0])
            for split in (1, 2, 4, 8):
                if split > 1 and (blocks * split > 1200 or k // split < 2 * base[1] or blocks >= 600
                                  or split * blocks * base[0] * bm > sk._WORKSPACE_FLOATS):  # fmt: skip
                    continue
                if fits(base, bm):
                    out.append(sk.SkinnyConfig(*base, split=split, block_m=bm))
    return out


def previous_best(rows: int, n: int, k: int, top: int) -> list[sk.SkinnyConfig]:
    """The union of the `top` fastest configs of every row count of this row bucket in the earlier sweep,
    each with and without PDL."""
    found: set[sk.SkinnyConfig] = set()
    for row in PREVIOUS.values():
        if (row["n"], row["k"], sk.row_bucket(row["rows"])) == (n, k, sk.row_bucket(rows)):
            timed = sorted((c["us"], name) for name, c in row["configs"].items() if "us" in c)
            found.update(sk.SkinnyConfig(*ast.literal_eval(name)[:6]) for _, name in timed[:top])
    return sorted({c._replace(pdl=pdl) for c in found for pdl in (False, True)})


def _compile(items: list[tuple]) -> list[str]:
    """Worker: launch each (config, rows) once on small operands, so Triton's disk cache holds its binary."""
    failed = []
    for config, rows in items:
        x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16)
        try:
            sk.skinny_matmul(x, w, config)
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 (out of resources: the config is skipped later)
            failed.append(f"{config} rows={rows}: {error!r}"[:200])
    return failed


def precompile(configs: set[tuple], workers: int = 12) -> list[str]:
    items = sorted(configs)
    chunks = [items[i::workers] for i in range(workers)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return [line for part in pool.map(_compile, chunks) for line in part]


def within_rounding(out: torch.Tensor, exact: torch.Tensor) -> tuple[bool, float]:
    """(every element within half a bf16 step of the float64 product, plus fp32 summation slack near zero;
    relative error of the whole output)."""
    scale = exact.norm()
    err = (out.float() - exact).abs()
    slack = 1e-3 * scale / exact.numel() ** 0.5
    return bool((err <= exact.abs() * 2.0**-8 * 1.01 + slack).all()), float(err.norm() / scale)


def measure_rows(x: torch.Tensor, weights: list[torch.Tensor], calls: int, failed: set) -> dict:
    """cuBLAS and every candidate config for one activation `x` against the rotated `weights`."""
    (rows, k), n = x.shape, weights[0].shape[0]
    exact = (x.double() @ weights[0].double().T).float()
    ok, rel = within_rounding(F.linear(x, weights[0]), exact)
    row = {"n": n, "k": k, "rows": rows, "cublas_us": graph_us(lambda w: F.linear(x, w), weights, calls),
           "cublas_rel_err": rel, "cublas_within_rounding": ok, "configs": {}}  # fmt: skip
    for config in candidates(rows, n, k):
        if (config, rows) in failed:
            continue
        try:
            out = sk.skinny_matmul(x, weights[0], config)
            again = sk.skinny_matmul(x, weights[0], config)
            ok, rel = within_rounding(out, exact)
            us = graph_us(lambda w, c=config: sk.skinny_matmul(x, w, c), weights, calls)
        except Exception as error:  # noqa: BLE001
            failed.add((config, rows))
            row["configs"][str(tuple(config))] = {"error": repr(error)[:160]}
            continue
        row["configs"][str(tuple(config))] = {
            "us": us, "rel_err": rel, "within_rounding": ok, "deterministic": bool(torch.equal(out, again)),
        }  # fmt: skip
    return row


def rotated(n: int, k: int) -> tuple[list[torch.Tensor], int]:
    """Copies of a random [n, k] bf16 weight totalling >= 512 MiB, and the launches a timing graph makes."""
    copies = max(2, -(-512 * 2**20 // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    return weights, max(copies, 8)


def sweep(rows_list: list[int], results: dict, save) -> None:  # noqa: ANN001
    failed: set = set()
    for model, projections in SHAPES.items():
        for name, (n, k) in projections.items():
            weights, calls = rotated(n, k)
            for rows in rows_list:
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                row = measure_rows(x, weights, calls, failed)
                results["sweep"][f"{model} {name} rows={rows}"] = row
                timed = [c["us"] for c in row["configs"].values() if "us" in c]
                ours, gb = min(timed, default=float("nan")), n * k * 2 / 1e3
                log(f"{model} {name:<8} rows={rows:<3} cublas {gb / row['cublas_us']:6.0f} GB/s  best ours "
                    f"{gb / ours:6.0f} GB/s  ({len(row['configs'])} configs)")  # fmt: skip
            save()
            del weights
            torch.cuda.empty_cache()


def choose(results: dict, rows_list: list[int]) -> dict[tuple[int, int, int], sk.SkinnyConfig | None]:
    """Per (row bucket, N, K): the valid config with the least summed time over the bucket's rows."""
    table: dict[tuple[int, int, int], sk.SkinnyConfig | None] = {}
    groups: dict[tuple, list[dict]] = {}
    for row in results["sweep"].values():
        groups.setdefault((sk.row_bucket(row["rows"]), row["n"], row["k"]), []).append(row)
    for key, rows in groups.items():
        common = set.intersection(*(set(r["configs"]) for r in rows))
        valid = [c for c in common if all(r["configs"][c].get("within_rounding") and r["configs"][c]["deterministic"]
                                          for r in rows)]  # fmt: skip
        cublas = sum(r["cublas_us"] for r in rows)
        best = min(valid, key=lambda c: sum(r["configs"][c]["us"] for r in rows), default=None)
        win = best is not None and sum(r["configs"][best]["us"] for r in rows) < 0.97 * cublas
        table[key] = sk.SkinnyConfig(*ast.literal_eval(best)) if win else None
    return table


def confirm(table: dict, rows_list: list[int], results: dict) -> None:
    """Times of cuBLAS and the chosen config measured again, in one fresh pass (unbiased by the choice)."""
    for model, projections in SHAPES.items():
        for name, (n, k) in projections.items():
            weights, calls = rotated(n, k)
            for rows in rows_list:
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                config = table.get((sk.row_bucket(rows), n, k))
                cublas = graph_us(lambda w, x=x: F.linear(x, w), weights, calls)
                ours = None
                if config is not None:
                    ours = graph_us(lambda w, x=x, c=config: sk.skinny_matmul(x, w, c), weights, calls)
                gbps = n * k * 2 / 1e3
                results["confirm"][f"{model} {name} rows={rows}"] = {
                    "config": None if config is None else list(config), "cublas_us": cublas, "ours_us": ours,
                    "cublas_GBps": gbps / cublas, "ours_GBps": gbps / ours if ours else None,
                }  # fmt: skip
                log(f"confirm {model} {name:<8} rows={rows:<3} cublas {gbps / cublas:6.0f} GB/s  ours "
                    + (f"{gbps / ours:6.0f} GB/s {config}" if ours else "(cuBLAS kept)"))  # fmt: skip
            del weights
            torch.cuda.empty_cache()


def engine_variant(hf, shape: str, variant: str, ids: list[int], reference: torch.Tensor) -> dict:  # noqa: ANN001
    from backends.local_engine.engine.cuda_runner import HostStep, padded_step
    from bench.engine_gpu import prefix_ttft, run_closed_loop, teacher_forced_logits
    from bench.lib.engine_gpu_models import build_ours, random_prompts

    vocab = hf.config.vocab_size
    os.environ["LLMGW_SKINNY_ROWS"] = "1" if variant == "cublas" else "64"
    os.environ["LLMGW_SKINNY_PDL"] = "0" if variant == "nopdl" else "1"
    ours = build_ours(hf, shape, "bf16", 32, 8192 if "8b" in shape else 4096)
    steps = ours.runner.cuda_steps
    row = prefix_ttft(ours, vocab)
    row["prefill_graph_ms"] = replay_ms(steps.prefill_graphs[(32, 2)][0])
    # a (64, 2) graph replays the capture's padding step: the buffers must hold a step of its shape
    padding = padded_step(HostStep([], [], [], [], [0], [], [], 1), 64, 2, steps.pad_slot, steps.block_size)
    steps.prefill_buffers.fill(padding, 64, 2, steps.width, steps.pad_slot)
    row["prefill_graph_64x2_ms"] = replay_ms(steps.prefill_graphs[(64, 2)][0])
    for bucket in (2, 8, 32):
        row[f"decode_graph_{bucket}_ms"] = replay_ms(steps.graphs[bucket][0])
    for clients in (8, 32):
        prompts = random_prompts(2 * clients, 64, 128, vocab, 9)
        row[f"clients_{clients}_tok_s"] = run_closed_loop(ours, prompts, clients, 64)["output_tok_s"]
    logits = teacher_forced_logits(ours, ids, 8)
    row["logits_max_abs_diff_vs_hf_fp32"] = float((logits - reference).abs().max())
    row["top1_agreement_vs_hf_fp32"] = float((logits.argmax(-1) == reference.argmax(-1)).float().mean())
    ours.free()
    del ours
    gc.collect()
    torch.cuda.empty_cache()
    log(f"{shape} {variant:<6} cold {row['cold_ms']:.2f} cached {row['cached_ms']:.2f} ms "
        f"(x{row['speedup']:.2f})  prefill graph {row['prefill_graph_ms']:.3f} ms  decode graph 2/8/32 "
        f"{row['decode_graph_2_ms']:.3f}/{row['decode_graph_8_ms']:.3f}/{row['decode_graph_32_ms']:.3f}"
        f"  8/32 clients {row['clients_8_tok_s']:.0f}/{row['clients_32_tok_s']:.0f} tok/s  logits "
        f"{row['logits_max_abs_diff_vs_hf_fp32']:.3g} top1 {row['top1_agreement_vs_hf_fp32']:.3f}")  # fmt: skip
    return row


def engine_ab(
    shapes: list[str], variants: list[str], rounds: int, deadline: float, results: dict, save
) -> None:  # fmt: skip
    """Rounds of (cuBLAS, kernel) per shape; a variant is skipped when the last one of its shape, started
    now, would end past `deadline` seconds (the first of a shape is assumed to take 120 s)."""
    from bench.lib.engine_gpu_models import build_hf, hf_logits, random_prompts

    models = {}
    for shape in shapes:
        hf = build_hf(shape, torch.device("cuda"), torch.float32)
        ids = random_prompts(1, 32, 32, hf.config.vocab_size, 5)[0]
        models[shape] = (hf, ids, hf_logits(hf, ids)[7:-1])
    took = dict.fromkeys(shapes, 120.0)
    for round_ in range(rounds):
        for shape in shapes:
            for variant in variants:
                key = f"{shape} {variant} round{round_ + 1}"
                if time.perf_counter() - _T0 + took[shape] > deadline:
                    log(f"deadline: {key} skipped")
                    continue
                start = time.perf_counter()
                try:
                    results["engine"][key] = engine_variant(
                        models[shape][0], shape, variant, *models[shape][1:]
                    )
                except Exception as error:  # keep what was measured
                    import traceback

                    traceback.print_exc()
                    results["engine"][key] = {"error": repr(error)}
                took[shape] = time.perf_counter() - start
                save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="32,2,8,16,64")
    parser.add_argument("--engine", default="llama-8b,llama-1b", help="engine A/B shapes ('' for none)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default="cublas,skinny", help="cublas, skinny, nopdl (skinny, PDL off)")
    parser.add_argument("--previous", help="an earlier engine_gpu_skinny.json: sweep only its best configs")
    parser.add_argument("--top", type=int, default=4, help="with --previous: configs per row count")
    parser.add_argument("--no-sweep", action="store_true", help="use skinny_triton's committed table")
    parser.add_argument("--deadline", type=float, default=560.0, help="A/B variants must end by then (s)")
    parser.add_argument("--out", default=os.environ.get("OUT", "studies/results"))
    args = parser.parse_args()
    from bench.engine_gpu import copy_bandwidth

    rows_list = [int(r) for r in args.rows.split(",")]
    if args.previous:
        PREVIOUS.update(json.loads(Path(args.previous).read_text())["sweep"])
        TOP[0] = args.top
    results: dict = {"device": torch.cuda.get_device_name(), "copy_GBps": copy_bandwidth() / 1e9,
                     "sweep": {}, "table": {}, "confirm": {}, "engine": {}}  # fmt: skip
    out = Path(args.out) / "engine_gpu_skinny.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(results, indent=1))

    log(f"{results['device']} copy {results['copy_GBps']:.0f} GB/s")
    if not args.no_sweep:
        wanted = {(c, rows) for m in SHAPES.values() for n, k in m.values() for rows in rows_list
                  for c in candidates(rows, n, k)}  # fmt: skip
        wanted = {(c._replace(split=min(c.split, 2)), c.block_m) for c, _ in wanted}  # one binary per kernel
        log(f"precompiling {len(wanted)} kernels")
        results["compile_failures"] = precompile(wanted)
        log(f"compiled ({len(results['compile_failures'])} failed)")
        sweep(rows_list, results, save)
        table = choose(results, rows_list)
        sk.set_table(table)
        results["table"] = {str(key): None if c is None else list(c) for key, c in table.items()}
        print("_TABLE = {  # (row bucket, N, K): (BLOCK_N, BLOCK_K, warps, stages, split, BLOCK_M)")
        for key, config in sorted(table.items()):
            print(f"    {key}: {None if config is None else tuple(config)},")
        print("}")
        save()
    confirm(dict(sk._TABLE), rows_list, results)
    save()
    shapes = [shape for shape in args.engine.split(",") if shape]
    if shapes:
        engine_ab(shapes, args.variants.split(","), args.rounds, args.deadline, results, save)
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
