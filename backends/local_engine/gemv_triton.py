"""Matrix-vector products for one-row activations (batch-1 decode) in Triton: bf16, int8 and int4 weights.

A decode step at batch 1 is bound by reading the weights once. cuBLAS reaches ~2 TB/s of the H200's ~4.2 on
the narrow 8B projections (4096-6144 outputs, bench/README.md), as few blocks stream few rows each. Here
every program streams BLOCK_N (4-16) weight rows through a K loop of wide tiles, multiplies them into
the activation row in fp32 and reduces once at the end, so N / BLOCK_N programs keep the memory system
busy even for N = 4096. Block sizes are autotuned per (N, K). int8: per-row scale; int4: nibble-packed
bytes (quant_triton.pack_int4), per-group (scale, min), applied to each group's partial sums.
"""

import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

_INTERPRET_CONFIG = {"BLOCK_N": 4, "BLOCK_K": 64}

if triton is not None:
    _CONFIGS = [  # (BLOCK_N, BLOCK_K, warps, stages); int8 rows want wide K tiles for 16-byte loads
        triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for n, k, w, s in ((4, 1024, 4, 3), (8, 512, 4, 3), (8, 1024, 4, 3), (16, 256, 4, 4), (16, 512, 4, 3),
                           (4, 512, 4, 4), (2, 2048, 4, 3), (4, 2048, 8, 3), (2, 4096, 8, 2), (8, 2048, 8, 3))
    ]  # fmt: skip

    @triton.autotune(configs=_CONFIGS, key=["N", "K", "INT8", "NORM", "SWIGLU"])
    @triton.jit
    def _gemv_kernel(
        x_ptr, w_ptr, s_ptr, o_ptr, nw_ptr, r_ptr, b_ptr, N, K, stride_wn, eps, INT8: tl.constexpr,
        NORM: tl.constexpr, RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr, BIAS: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        act = o_ptr.dtype.element_ty
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        cols = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            ks = k + cols
            x = tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
            if NORM:  # W (x rstd w) = rstd W (x w): the row's RMS is summed along and applied at the end
                squares += x * x
                x *= tl.load(nw_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
            mask = row_ok[:, None] & (ks[None, :] < K)
            w = tl.load(w_ptr + rows[:, None] * stride_wn + ks[None, :], mask=mask, other=0)
            acc += w.to(tl.float32) * x[None, :]
            if SWIGLU:  # the matching "up" rows sit N rows below the "gate" rows
                up = tl.load(w_ptr + (rows[:, None] + N) * stride_wn + ks[None, :], mask=mask, other=0)
                acc_up += up.to(tl.float32) * x[None, :]
        rstd = 1.0
        if NORM:
            rstd = 1.0 / tl.sqrt(tl.sum(squares, 0) / K + eps)
        out = tl.sum(acc, 1) * rstd
        if INT8:
            out *= tl.load(s_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        if BIAS:
            bias = tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(act).to(tl.float32)
            out = out.to(act).to(tl.float32) + bias
        if SWIGLU:
            up_out = tl.sum(acc_up, 1) * rstd
            if INT8:
                up_out *= tl.load(s_ptr + rows + N, mask=row_ok, other=0.0).to(tl.float32)
            gate = out.to(act).to(tl.float32)
            out = gate / (1.0 + tl.exp(-gate)) * up_out.to(act).to(tl.float32)
        if RESIDUAL:
            out = out.to(act).to(tl.float32) + tl.load(r_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(o_ptr + rows, out.to(act), mask=row_ok)

    _INT4_CONFIGS = [
        triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=4, num_stages=s)
        for n, k, s in ((4, 1024, 3), (8, 512, 3), (8, 1024, 3), (16, 256, 4), (16, 512, 3), (4, 2048, 3))
    ]

    @triton.autotune(configs=_INT4_CONFIGS, key=["N", "K"])
    @triton.jit
    def _gemv_int4_kernel(
        x_ptr, w_ptr, s_ptr, z_ptr, o_ptr, N, K, stride_wn, stride_sn, GROUP: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        pairs = tl.arange(0, BLOCK_K // 2)
        groups = tl.arange(0, BLOCK_K // GROUP)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        row_ok = rows[:, None] < N
        for k in range(0, K, BLOCK_K):
            half = k // 2 + pairs
            in_k = 2 * half < K
            packed = tl.load(
                w_ptr + rows[:, None] * stride_wn + half[None, :], mask=row_ok & in_k[None, :], other=0
            )
            x_even = tl.load(x_ptr + 2 * half, mask=in_k, other=0.0).to(tl.float32)
            x_odd = tl.load(x_ptr + 2 * half + 1, mask=in_k, other=0.0).to(tl.float32)
            products = (packed & 15).to(tl.float32) * x_even[None, :] + (packed >> 4).to(tl.float32) * x_odd[
                None, :
            ]
            sums = tl.sum(tl.reshape(products, [BLOCK_N, BLOCK_K // GROUP, GROUP // 2]), 2)
            x_sums = tl.sum(tl.reshape(x_even + x_odd, [BLOCK_K // GROUP, GROUP // 2]), 1)
            g = k // GROUP + groups
            g_ok = row_ok & (g[None, :] < K // GROUP)
            scale = tl.load(s_ptr + rows[:, None] * stride_sn + g[None, :], mask=g_ok, other=0.0).to(
                tl.float32
            )
            low = tl.load(z_ptr + rows[:, None] * stride_sn + g[None, :], mask=g_ok, other=0.0).to(tl.float32)
            acc += tl.sum(sums * scale + low * x_sums[None, :], 1)
        tl.store(o_ptr + rows, acc.to(o_ptr.dtype.element_ty), mask=rows < N)


def _launch(kernel, n: int, *args, **constants) -> None:  # noqa: ANN001 (Triton kernel objects)
    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(n, meta["BLOCK_N"]),)

    if os.environ.get("TRITON_INTERPRET") == "1":
        kernel.fn[grid(_INTERPRET_CONFIG)](*args, **constants, **_INTERPRET_CONFIG)
    else:
        kernel[grid](*args, **constants)


def gemv(
    x: Tensor, weight: Tensor, scale: Tensor | None = None, *, bias: Tensor | None = None,
    norm: Tensor | None = None, eps: float = 0.0, residual: Tensor | None = None, swiglu: bool = False,
) -> Tensor:  # fmt: skip
    """x [1, K] @ weight[N, K].T (bf16/fp16 weight, or int8 with per-row `scale`) → [1, N] in x's dtype.

    Fused extras for the batch-1 decode layer (model.py): `norm` applies RMSNorm (that weight, `eps`) to x
    first; `bias` is added; `swiglu` reads a fused [gate; up] weight of 2N' rows and returns
    silu(gate) * up [1, N']; `residual` [1, N] is added to the result."""
    x = x.contiguous()
    rows = weight.shape[0] // 2 if swiglu else weight.shape[0]
    out = torch.empty(1, rows, dtype=x.dtype, device=x.device)
    _launch(_gemv_kernel, rows, x, weight, weight if scale is None else scale, out,
            x if norm is None else norm, x if residual is None else residual, x if bias is None else bias,
            rows, weight.shape[1], weight.stride(0), eps, INT8=scale is not None, NORM=norm is not None,
            RESIDUAL=residual is not None, SWIGLU=swiglu, BIAS=bias is not None)  # fmt: skip
    return out


def gemv_int4(x: Tensor, packed: Tensor, scales: Tensor, mins: Tensor, group: int) -> Tensor:
    """x [1, K] against packed int4 [N, K / 2] with per-group scales / mins [N, K / group]."""
    x = x.contiguous()
    out = torch.empty(1, packed.shape[0], dtype=x.dtype, device=x.device)
    _launch(_gemv_int4_kernel, packed.shape[0], x, packed, scales, mins, out, packed.shape[0], 2 * packed.shape[1],
            packed.stride(0), scales.stride(0), GROUP=group)  # fmt: skip
    return out
