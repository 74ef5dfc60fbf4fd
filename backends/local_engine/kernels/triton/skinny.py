"""bf16 matmul for skinny activations (2..64 rows) in Triton: streams the [N, K] weight once.

At 2-64 rows a linear layer is bound by reading its weight, like the batch-1 GEMV (kernels/triton/gemv.py), but
there are too many rows for CUDA-core FMAs (32 rows: 32 FMAs per weight element, over the fp32 rate at the
H200's 4.2 TB/s). Here the tensor cores do the arithmetic with the operands swapped: every program owns
BLOCK_N weight rows (output columns) for all rows of x, and per K tile computes
    acc[BLOCK_N, BLOCK_M] += W[BLOCK_N, BLOCK_K] @ x[BLOCK_M, BLOCK_K]^T
in fp32, so the wide weight tile is the MMA's M side and the few activation rows (padded to BLOCK_M with a
repeated last row, not masks) its N side. N / BLOCK_N programs stream the weight with `num_stages` tiles in
flight; a narrow weight (few programs for the SMs) can also be split along K: each of SPLIT programs of an
output block writes its fp32 partial to a workspace, and the one that arrives last (an atomic counter,
which it resets) adds all partials in split order, so the result does not depend on the arrival order.

Rounding: products of bf16 are exact in fp32, sums are fp32, the output is rounded to bf16 once, as
cuBLAS's F.linear does (the summation order differs, so results may differ in the last bf16 bit).
Block sizes per (rows bucket, N, K): `config_for` (measured on the H200, studies/engine_gpu_skinny.py).
"""

from typing import NamedTuple

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

MAX_ROWS = 64
_WORKSPACE_FLOATS = 1 << 22  # 16 MiB of fp32 partials per device; a split that needs more is not taken
_COUNTERS = 1 << 14


class SkinnyConfig(NamedTuple):
    """Weight rows per program, K tile, warps, pipeline stages, K split, activation rows padded to, and
    whether the launch is a programmatic dependent one (PDL: the grid may start before the previous kernel
    has finished; it waits for it with griddepcontrol.wait before reading anything)."""

    block_n: int
    block_k: int
    warps: int
    stages: int
    split: int = 1
    block_m: int = 16
    pdl: bool = False


_INTERPRET_CONFIG = SkinnyConfig(16, 32, 1, 1)

if triton is not None:
    from triton.language.extra.cuda import gdc_wait

    @triton.jit(do_not_specialize=["M"])
    def _skinny_kernel(
        x_ptr, w_ptr, o_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_wn, stride_om, k_per_split, split,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PARTIAL: tl.constexpr,
        EVEN_K: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        if PDL:  # launched before the previous kernel ended: wait for its writes (x) to be visible
            gdc_wait()
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        w_rows = tl.where(cols < N, cols, N - 1)  # no masks in the loop: spare rows repeat valid ones
        rows = tl.arange(0, BLOCK_M)
        x_rows = tl.where(rows < M, rows, M - 1)
        inner = tl.arange(0, BLOCK_K)
        w_base = w_ptr + w_rows[:, None].to(tl.int64) * stride_wn
        x_base = x_ptr + x_rows[:, None] * stride_xm
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        k_start = pid_k * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        for k in range(k_start, k_end, BLOCK_K):
            ks = k + inner
            if EVEN_K:
                w = tl.load(w_base + ks[None, :])
                x = tl.load(x_base + ks[None, :])
            else:
                w = tl.load(w_base + ks[None, :], mask=ks[None, :] < K, other=0.0)
                x = tl.load(x_base + ks[None, :], mask=ks[None, :] < K, other=0.0)
            acc = tl.dot(w, tl.trans(x), acc)
        out_mask = (cols[:, None] < N) & (rows[None, :] < M)
        out_ptrs = o_ptr + rows[None, :] * stride_om + cols[:, None]
        if not PARTIAL:
            tl.store(out_ptrs, acc.to(o_ptr.dtype.element_ty), mask=out_mask)
        else:
            tile = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + rows[None, :]
            blocks = tl.num_programs(0)
            tl.store(ws_ptr + (pid_k * blocks + pid_n) * (BLOCK_N * BLOCK_M) + tile, acc)
            tl.debug_barrier()  # every thread's partial is written before the (release) count
            arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == split - 1:  # last of the split: sum the partials in split order
                total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
                for s in range(split):
                    part = ws_ptr + (s * blocks + pid_n) * (BLOCK_N * BLOCK_M) + tile
                    total += tl.load(part, cache_modifier=".cg")
                tl.store(out_ptrs, total.to(o_ptr.dtype.element_ty), mask=out_mask)
                tl.atomic_xchg(cnt_ptr + pid_n, 0)  # ready for the next launch (and graph replay)


def row_bucket(rows: int) -> int:
    return 8 if rows <= 8 else 16 if rows <= 16 else 32 if rows <= 32 else 64


# (row bucket, N, K) of the Llama-3 8B / 1B projections -> (BLOCK_N, BLOCK_K, warps, stages, split, BLOCK_M):
# per bucket the config with the least summed time over its row counts, averaged over two H200 sweeps, kept
# where it beat cuBLAS by >= 3 % (None: cuBLAS); PDL launches are left off (slower inside the engine's
# graphs). `python3 -m studies.engine_gpu_skinny`; bench/results/engine_gpu_skinny_{sweep1,ab}.json.
_MEASURED = {  # fmt: skip
    (8, 2048, 2048): None,
    (8, 2048, 8192): (32, 128, 2, 5, 4, 8),
    (8, 3072, 2048): None,
    (8, 4096, 4096): (32, 512, 4, 4, 1, 8),
    (8, 4096, 14336): None,
    (8, 6144, 4096): None,
    (8, 16384, 2048): None,
    (8, 28672, 4096): None,
    (8, 128256, 2048): (256, 128, 8, 3, 1, 8),
    (8, 128256, 4096): (128, 128, 8, 4, 1, 16),
    (16, 2048, 2048): (16, 256, 1, 4, 1, 16),
    (16, 2048, 8192): (32, 128, 2, 5, 4, 16),
    (16, 3072, 2048): None,
    (16, 4096, 4096): (64, 128, 4, 6, 1, 16),
    (16, 4096, 14336): None,
    (16, 6144, 4096): (64, 128, 4, 6, 1, 16),
    (16, 16384, 2048): None,
    (16, 28672, 4096): (64, 128, 4, 4, 1, 16),
    (16, 128256, 2048): (128, 128, 4, 3, 1, 16),
    (16, 128256, 4096): (128, 128, 4, 3, 1, 16),
    (32, 2048, 2048): None,
    (32, 2048, 8192): (64, 128, 4, 4, 4, 32),
    (32, 3072, 2048): None,
    (32, 4096, 4096): (64, 128, 4, 6, 1, 32),
    (32, 4096, 14336): (32, 512, 4, 4, 1, 32),
    (32, 6144, 4096): (64, 128, 4, 6, 1, 32),
    (32, 16384, 2048): None,
    (32, 28672, 4096): None,
    (32, 128256, 2048): (256, 128, 8, 3, 1, 32),
    (32, 128256, 4096): (256, 128, 8, 3, 1, 32),
    (64, 2048, 2048): None,
    (64, 2048, 8192): None,
    (64, 3072, 2048): None,
    (64, 4096, 4096): None,
    (64, 4096, 14336): (64, 128, 4, 6, 2, 64),
    (64, 6144, 4096): None,
    (64, 16384, 2048): None,
    (64, 28672, 4096): None,
    (64, 128256, 2048): (128, 64, 4, 4, 1, 64),
    (64, 128256, 4096): (128, 128, 8, 4, 1, 64),
}
_TABLE: dict[tuple[int, int, int], SkinnyConfig | None] = {
    key: None if value is None else SkinnyConfig(*value) for key, value in _MEASURED.items()
}
_DEFAULT = SkinnyConfig(64, 128, 4, 4)  # a direct call for a shape the table does not hold


def set_table(table: dict[tuple[int, int, int], SkinnyConfig | None]) -> None:
    """Replace the measured table (studies/engine_gpu_skinny.py installs what it just measured)."""
    _TABLE.clear()
    _TABLE.update(table)


def config_for(rows: int, n: int, k: int) -> SkinnyConfig | None:
    """Tile sizes for `rows` activation rows and an [n, k] weight; None (cuBLAS) where the kernel measured
    no faster or for a shape that was not measured."""
    return _TABLE.get((row_bucket(rows), n, k))


_WORKSPACES: dict[torch.device, tuple[Tensor, Tensor]] = {}


def _workspace(device: torch.device) -> tuple[Tensor, Tensor] | None:
    """The device's split-K partials and counters (zero), allocated on first use; None while a CUDA graph is
    being captured before any exists (then the caller does not split: a capture must not allocate it)."""
    if device not in _WORKSPACES:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        _WORKSPACES[device] = (
            torch.empty(_WORKSPACE_FLOATS, dtype=torch.float32, device=device),
            torch.zeros(_COUNTERS, dtype=torch.int32, device=device),
        )
    return _WORKSPACES[device]


def skinny_matmul(
    x: Tensor, weight: Tensor, config: SkinnyConfig | None = None, out: Tensor | None = None
) -> Tensor:
    """x [M, K] @ weight[N, K].T -> [M, N] in x's dtype, for 1 <= M <= MAX_ROWS (bf16 on CUDA), written
    into `out` [M, N] (row-contiguous) when given."""
    rows, inner = x.shape
    n = weight.shape[0]
    if rows > MAX_ROWS or weight.shape[1] != inner:
        raise ValueError(f"skinny_matmul takes 1..{MAX_ROWS} rows of {weight.shape[1]}, got {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    if out is None:
        out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    interpret = triton.knobs.runtime.interpret
    cfg = config or (_INTERPRET_CONFIG if interpret else config_for(rows, n, inner) or _DEFAULT)
    bm = max(cfg.block_m, row_bucket(rows))
    blocks = triton.cdiv(n, cfg.block_n)
    split = max(1, min(cfg.split, triton.cdiv(inner, cfg.block_k)))
    space = _workspace(x.device) if split > 1 else None
    if space is None or split * blocks * cfg.block_n * bm > space[0].numel() or blocks > space[1].numel():
        split, space = 1, (out, out)
    per_split = triton.cdiv(triton.cdiv(inner, split), cfg.block_k) * cfg.block_k
    split = triton.cdiv(inner, per_split)  # no empty split
    pdl = cfg.pdl and not interpret
    launch = {} if interpret else {"num_warps": cfg.warps, "num_stages": cfg.stages, "launch_pdl": pdl}
    _skinny_kernel[(blocks, split)](
        x, weight, out, space[0], space[1], rows, n, inner, x.stride(0), weight.stride(0), out.stride(0),
        per_split, split, BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PARTIAL=split > 1,
        EVEN_K=inner % cfg.block_k == 0, PDL=pdl, **launch,
    )  # fmt: skip
    return out
