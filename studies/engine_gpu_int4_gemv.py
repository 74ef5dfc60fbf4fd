"""A batch-1 int4 GEMV on plain 2-D nibble tiles, against tinygemm (issue 17: int4 at 8B is 34.6 % of roofline).

    python3 -m studies.engine_gpu_int4_gemv [--out DIR]          # CUDA; TRITON_INTERPRET=1 checks it on the CPU

Not used by the engine: a measured prototype. The engine's int4 runs torch's tinygemm
(`_weight_int4pack_mm`, ~1.0-1.5 TB/s on the 8B projections); an earlier Triton GEMV on [rows, groups, bytes]
tiles reached 201 tok/s against tinygemm's 301 (its 3-D tiles compiled to shuffles).

Layout ("kpack8", group size 32): K is cut into chunks of 256 inputs = 8 groups. Word j (0..31) of chunk c
of row n is an int32 holding the 8 codes q[n, 256c + 32i + j], i = 0..7, nibble i at bits 4i..4i+3. A program
loads a [BLOCK_N, 32] tile of words per chunk, and nibble i of the whole tile is group 8c + i: a plain 2-D
tile whose row sums are the group's dot products, so a group's scale and min are applied once per row:
Σ_k (q s + m) x = s Σ q x + m Σ x. Codes become floats through the mantissa (bits 0x3F800000 | q << 19 =
1 + q/16: one shift and one and-or per code, no int-to-float conversion), or with MANTISSA off through a
plain conversion. K is split over programs (SPLIT) whose fp32 partials are added atomically.

Prints GB/s of the int4 bytes (codes + bf16 scale and min per group) per config beside tinygemm's, each a
launch's share of a CUDA graph cycling through >= 512 MiB of weight copies; JSON: engine_gpu_int4_gemv.json.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

from studies.gpu_timing import graph_us  # fn(i) launched for i over a list, in one graph

GROUP = 32
CHUNK = 8 * GROUP


@triton.jit
def _kpack8_gemv(
    x_ptr, w_ptr, s_ptr, m_ptr, o_ptr, N, K, num_chunks,
    CHUNKS_PER_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, MANTISSA: tl.constexpr, ACC2D: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.where(rows < N, rows, N - 1)
    words = tl.arange(0, 32)
    w_row = w_ptr + rows[:, None].to(tl.int64) * (K // 8)
    groups_per_row = K // 32
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2d = tl.zeros([BLOCK_N, 32], dtype=tl.float32)  # ACC2D: scaled products summed per lane, reduced once
    for step in range(CHUNKS_PER_SPLIT):  # a fixed count: the last split's spare steps load nothing
        c = pid_k * CHUNKS_PER_SPLIT + step
        valid = c < num_chunks
        w = tl.load(w_row + c * 32 + words[None, :], mask=valid, other=0)
        for i in tl.static_range(8):
            x = tl.load(x_ptr + c * 256 + i * 32 + words, mask=valid, other=0.0).to(tl.float32)
            g = c * 8 + i
            scale = tl.load(s_ptr + rows.to(tl.int64) * groups_per_row + g, mask=valid, other=0.0)
            low = tl.load(m_ptr + rows.to(tl.int64) * groups_per_row + g, mask=valid, other=0.0)
            scale, low = scale.to(tl.float32), low.to(tl.float32)
            if MANTISSA:  # 1 + q / 16 through the float's mantissa
                if i <= 4:  # noqa: SIM108 (constexpr branches of the kernel)
                    shifted = w << (19 - 4 * i)
                else:
                    shifted = w >> (4 * i - 19)
                f = ((shifted & 0x00780000) | 0x3F800000).to(tl.float32, bitcast=True)
                if ACC2D:  # 16 s (x f - x) = s q x per element: no reduction inside the loop
                    acc2d += (16.0 * scale)[:, None] * (f * x[None, :] - x[None, :])
                    acc += low * tl.sum(x, 0)
                else:
                    dot = (tl.sum(f * x[None, :], 1) - tl.sum(x, 0)) * 16.0
                    acc += scale * dot + low * tl.sum(x, 0)
            else:
                q = ((w >> (4 * i)) & 0xF).to(tl.float32)
                acc += scale * tl.sum(q * x[None, :], 1) + low * tl.sum(x, 0)
    if ACC2D:
        acc += tl.sum(acc2d, 1)
    real = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.atomic_add(o_ptr + real, acc, mask=real < N)


def pack_kpack8(q: torch.Tensor) -> torch.Tensor:
    """int codes 0..15 [N, K] (K % 256 == 0) → int32 [N, K/8] in the kpack8 layout above."""
    n, k = q.shape
    codes = q.to(torch.int32).view(n, k // CHUNK, 8, 32)  # [n, chunk, nibble i, word j]
    shifts = (4 * torch.arange(8, device=q.device, dtype=torch.int32)).view(1, 1, 8, 1)
    return (codes << shifts).sum(2, dtype=torch.int64).to(torch.int32).view(n, k // 8)  # wraps like uint32


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes [N, K], scale [N, K/32] bf16, min [N, K/32] bf16, the dequantized weight fp32)."""
    n, k = weight.shape
    groups = weight.float().view(n, k // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-8).bfloat16()
    low = low.bfloat16()
    q = ((groups - low.float()[..., None]) / scale.float()[..., None]).round().clamp(0, 15).to(torch.int32)
    dense = (q * scale.float()[..., None] + low.float()[..., None]).view(n, k)
    return q.view(n, k), scale, low, dense


def gemv(
    x: torch.Tensor, packed, scale, low, n: int, block_n: int, split: int, mantissa: bool, acc2d: bool = False
) -> torch.Tensor:
    k = x.shape[-1]
    out = torch.zeros(n, dtype=torch.float32, device=x.device)
    chunks = k // CHUNK
    per_split = triton.cdiv(chunks, split)
    grid = (triton.cdiv(n, block_n), triton.cdiv(chunks, per_split))
    _kpack8_gemv[grid](
        x, packed, scale, low, out, n, k, chunks, per_split, BLOCK_N=block_n, MANTISSA=mantissa, ACC2D=acc2d
    )
    return out


SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}  # fmt: skip
CONFIGS = [(bn, split, True, acc) for acc in (True, False) for bn in (32, 64) for split in (2, 4)]


def check(device: str) -> float:
    """Largest relative error of the kernel against the dequantized weight over a few configs."""
    torch.manual_seed(0)
    worst = 0.0
    for n, k in ((40, 512), (70, 768)):
        weight = torch.randn(n, k, device=device) * 0.05
        q, scale, low, dense = quantize(weight)
        packed = pack_kpack8(q)
        x = torch.randn(k, device=device).bfloat16()
        exact = dense.double() @ x.double()
        for config in (
            (16, 1, True),
            (32, 3, True),
            (16, 2, False),
            (16, 2, True, True),
            (32, 3, True, True),
        ):
            out = gemv(x, packed, scale, low, n, *config)
            worst = max(worst, float((out.double() - exact).norm() / exact.norm()))
    return worst


def measure(name: str, n: int, k: int) -> dict:
    from backends.local_engine.kernels.quant import Int4Linear

    weight = torch.randn(n, k, device="cuda") * 0.02
    q, scale, low, _ = quantize(weight)
    nbytes = n * k // 2 + 2 * 2 * n * (k // GROUP)
    count = max(2, -(-512 * 2**20 // nbytes))
    ours = [(pack_kpack8(q), scale.clone(), low.clone()) for _ in range(count)]
    os.environ["LLMGW_INT4_KERNEL"] = "tinygemm"
    tiny = [Int4Linear(weight, None, GROUP) for _ in range(count)]
    del weight, q
    x = torch.randn(1, k, device="cuda").bfloat16()
    row = {"bytes": nbytes, "tinygemm_us": graph_us(lambda i: tiny[i](x), list(range(count)), max(count, 8))}
    for block_n, split, mantissa, acc2d in CONFIGS:
        key = f"bn{block_n} split{split} {'acc2d' if acc2d else 'mantissa' if mantissa else 'i2f'}"
        row[key] = graph_us(
            lambda i, c=(block_n, split, mantissa, acc2d): gemv(x[0], *ours[i], n, *c),
            list(range(count)),
            max(count, 8),
        )
    best = min((v, k) for k, v in row.items() if k.startswith("bn"))
    row["best"] = best[1]
    print(f"{name:<8} {n:>6}x{k:<6} tinygemm {nbytes / row['tinygemm_us'] / 1e3:6.0f} GB/s  "
          f"best {best[1]:<22} {nbytes / best[0] / 1e3:6.0f} GB/s", flush=True)  # fmt: skip
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "studies/results"))
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "rel_err": check(device),
    }
    print(f"relative error against the dequantized weight: {results['rel_err']:.2e}", flush=True)
    if device == "cuda":
        results["rows"] = {name: measure(name, n, k) for name, (n, k) in SHAPES.items()}
        total = {key: sum(r[key] for r in results["rows"].values()) for key in results["rows"]["qkv"]
                 if key != "best" and key != "bytes"}  # fmt: skip
        results["per_layer_us"] = total
        print(
            "summed over the five projections, µs:",
            json.dumps({k: round(v, 1) for k, v in sorted(total.items(), key=lambda kv: kv[1])[:6]}),
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "engine_gpu_int4_gemv.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
