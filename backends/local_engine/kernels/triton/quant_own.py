"""Weight-only int8 matmul in Triton for CUDA: reads the int8 bytes, widens them in registers.

out[M, N] = (x[M, K] @ q[N, K].T) * scale[N]. Decode steps have few rows (M <= 64): the kernel tiles N
and K, widens each int8 tile to the activation dtype and accumulates in fp32 with tl.dot, so the weight
is read once, as int8 (half the bytes of bf16). For many rows (prefill) the matmul is compute-bound:
the weight is widened once per call and cuBLAS runs. Block sizes are autotuned per (N, K, rows bucket).
The engine's own fallback; quant.py prefers the kernels of `kernels/` when present.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from backends.local_engine.kernels.triton.gemv import gemv

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

MAX_KERNEL_ROWS = 64
_INTERPRET_CONFIG = {"BLOCK_N": 16, "BLOCK_K": 64}  # Triton's interpreter (CPU tests) cannot autotune


def _launch(kernel, grid, *args, **constants) -> None:  # noqa: ANN001 (Triton kernel objects)
    if triton.knobs.runtime.interpret:
        kernel.fn[grid(_INTERPRET_CONFIG)](*args, **constants, **_INTERPRET_CONFIG)
    else:
        kernel[grid](*args, **constants)


if triton is not None:
    _CONFIGS = [
        triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for n, k, w, s in ((16, 256, 4, 4), (32, 256, 4, 4), (64, 128, 4, 4), (32, 512, 8, 3))
    ]

    @triton.autotune(configs=_CONFIGS, key=["N", "K", "BLOCK_M"])
    @triton.jit
    def _int8_matmul_kernel(
        x_ptr, w_ptr, s_ptr, o_ptr, M, N, K, stride_xm, stride_wn, stride_om,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        inner = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            ks = k + inner
            a = tl.load(
                x_ptr + rows[:, None] * stride_xm + ks[None, :],
                mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0,
            )  # fmt: skip
            b = tl.load(
                w_ptr + cols[:, None] * stride_wn + ks[None, :],
                mask=(cols[:, None] < N) & (ks[None, :] < K), other=0,
            )  # fmt: skip
            acc += tl.dot(a, tl.trans(b.to(a.dtype)), input_precision=DOT_PRECISION)
        scale = tl.load(s_ptr + cols, mask=cols < N, other=0.0)
        out = acc * scale[None, :].to(tl.float32)
        tl.store(
            o_ptr + rows[:, None] * stride_om + cols[None, :], out.to(o_ptr.dtype.element_ty),
            mask=(rows[:, None] < M) & (cols[None, :] < N),
        )  # fmt: skip

    @triton.autotune(configs=_CONFIGS, key=["N", "K", "BLOCK_M"])
    @triton.jit
    def _int4_matmul_kernel(
        x_ptr, w_ptr, s_ptr, z_ptr, o_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om,
        GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        """w [N, K / 2] uint8: byte j holds k = 2j (low nibble) and 2j + 1 (high); w = q * s + z per group."""
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        pairs = tl.arange(0, BLOCK_K // 2)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            half = k // 2 + pairs
            in_k = (2 * half)[None, :] < K
            col_ok = cols[:, None] < N
            packed = tl.load(w_ptr + cols[:, None] * stride_wn + half[None, :], mask=col_ok & in_k, other=0)
            group = (2 * half) // GROUP
            scale = tl.load(s_ptr + cols[:, None] * stride_sn + group[None, :], mask=col_ok & in_k, other=0.0)
            zero = tl.load(z_ptr + cols[:, None] * stride_sn + group[None, :], mask=col_ok & in_k, other=0.0)
            scale = scale.to(tl.float32)
            zero = zero.to(tl.float32)
            low = ((packed & 15).to(tl.float32) * scale + zero).to(x_ptr.dtype.element_ty)
            high = ((packed >> 4).to(tl.float32) * scale + zero).to(x_ptr.dtype.element_ty)
            row_ok = rows[:, None] < M
            x_even = tl.load(
                x_ptr + rows[:, None] * stride_xm + (2 * half)[None, :], mask=row_ok & in_k, other=0.0
            )
            x_odd = tl.load(
                x_ptr + rows[:, None] * stride_xm + (2 * half + 1)[None, :], mask=row_ok & in_k, other=0.0
            )
            acc += tl.dot(x_even, tl.trans(low), input_precision=DOT_PRECISION)
            acc += tl.dot(x_odd, tl.trans(high), input_precision=DOT_PRECISION)
        tl.store(
            o_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(o_ptr.dtype.element_ty),
            mask=(rows[:, None] < M) & (cols[None, :] < N),
        )  # fmt: skip


def pack_int4(q: Tensor) -> Tensor:
    """q [N, K] in 0..15 → [N, K / 2] uint8, low nibble = even k."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)


def dequantize_packed_int4(
    packed: Tensor, scales: Tensor, zeros: Tensor, group: int, dtype: torch.dtype
) -> Tensor:
    nibbles = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(1).to(dtype)
    return nibbles * scales.to(dtype).repeat_interleave(group, 1) + zeros.to(dtype).repeat_interleave(
        group, 1
    )


def _tiled(kernel, x: Tensor, n: int, weights: tuple, strides: tuple, **constants) -> Tensor:  # noqa: ANN001
    """Launch a tiled kernel (x, *weights, out, M, N, K, stride_xm, *weight strides, stride_om)."""
    rows, inner = x.shape
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    block_m = 16 if rows <= 16 else MAX_KERNEL_ROWS

    def grid(meta: dict) -> tuple[int, int]:
        return (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(rows, block_m))

    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32 inputs: no TF32 rounding in the dots
    _launch(
        kernel, grid, x, *weights, out, rows, n, inner, x.stride(0), *strides, out.stride(0), BLOCK_M=block_m,
        DOT_PRECISION=precision, **constants,
    )  # fmt: skip
    return out


def int4_matmul(x: Tensor, packed: Tensor, scales_mins: Tensor, group: int) -> Tensor:
    """x [M, K], packed [N, K / 2] uint8, scales_mins [2, N, K / group] (w = q * scale + min) → [M, N]."""
    scales, mins = scales_mins[0], scales_mins[1]
    if x.shape[0] > MAX_KERNEL_ROWS or triton is None:
        return F.linear(x, dequantize_packed_int4(packed, scales, mins, group, x.dtype))
    if x.shape[0] == 1:
        return gemv(x, packed, scales_mins)
    return _tiled(
        _int4_matmul_kernel, x.contiguous(), packed.shape[0], (packed, scales, mins),
        (packed.stride(0), scales.stride(0)), GROUP=group,
    )  # fmt: skip


def int8_matmul(x: Tensor, q: Tensor, scale: Tensor) -> Tensor:
    """x [M, K] (bf16/fp16/fp32), q [N, K] int8, scale [N] → [M, N] in x's dtype."""
    if x.shape[0] > MAX_KERNEL_ROWS or triton is None:
        return F.linear(x, q.to(x.dtype)) * scale.to(x.dtype)
    if x.shape[0] == 1:
        return gemv(x, q, scale)
    return _tiled(_int8_matmul_kernel, x.contiguous(), q.shape[0], (q, scale), (q.stride(0),))
