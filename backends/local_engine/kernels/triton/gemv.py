"""Matrix-vector products for one-row activations (batch-1 decode) in Triton: bf16, int8 and int4 weights.

A decode step at batch 1 is bound by reading the weights once. cuBLAS reaches ~2 TB/s of the H200's ~4.2 on
the narrow 8B projections (4096-6144 outputs, studies/README.md), as few blocks stream few rows each. Here
every program streams BLOCK_N weight rows through a K loop of wide tiles, multiplies them into the
activation row in fp32 and reduces once at the end, so N / BLOCK_N programs keep the memory system busy
even for N = 4096. Block sizes are autotuned per (N, K).

Quantized weights never go through the GPU's integer-to-float conversion, which runs at a quarter of the
fp32 rate and held int8 at ~2.4 TB/s (studies/README.md): the integer is written into the mantissa of a float
in [1, 2) with two integer ops, and the affine offset that this adds is taken out once per row (int8, per-row
scale) or per group (int4: nibble-packed bytes, quant_triton.pack_int4, per-group bf16 scale and min):
  int8 q in [-127, 127]: bits 0x3FC00000 + q * 2^15 are the float 1.5 + q / 256, so sum(q x) = 256 (A - 1.5 X)
  int4 q in [0, 15]:     bits 0x3F800000 | q << 19 are the float 1 + q / 16,     so sum(q x) = 16 (A - X)
with A = sum(f x) and X = sum(x) over the row (int8) or the group (int4).
"""

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

_INTERPRET_CONFIG = {"BLOCK_N": 4, "BLOCK_K": 64}
_INTERPRET_INT4_CONFIG = {"BLOCK_N": 4, "BLOCK_G": 2}

if triton is not None:
    _CONFIGS = [  # (BLOCK_N, BLOCK_K, warps, stages); int8 rows want wide K tiles for 16-byte loads
        triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for n, k, w, s in ((4, 1024, 4, 3), (8, 512, 4, 3), (8, 1024, 4, 3), (16, 256, 4, 4), (16, 512, 4, 3),
                           (4, 512, 4, 4), (2, 2048, 4, 3), (4, 2048, 8, 3), (2, 4096, 8, 2), (8, 2048, 8, 3),
                           (16, 1024, 8, 3), (32, 512, 8, 3), (1, 4096, 4, 2), (2, 4096, 4, 2), (4, 4096, 8, 2),
                           (8, 4096, 8, 2), (4, 2048, 4, 4), (8, 1024, 2, 4))
    ]  # fmt: skip

    @triton.jit
    def _finish(
        out, up_out, rows, row_ok, o_ptr, r_ptr, b_ptr, RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr,
        BIAS: tl.constexpr,
    ):  # fmt: skip
        """Bias, SwiGLU and residual on the fp32 row results, rounded to the activation dtype between steps
        as the unfused ops would round them; then the store."""
        act = o_ptr.dtype.element_ty
        if BIAS:
            bias = tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(act).to(tl.float32)
            out = out.to(act).to(tl.float32) + bias
        if SWIGLU:
            gate = out.to(act).to(tl.float32)
            out = gate / (1.0 + tl.exp(-gate)) * up_out.to(act).to(tl.float32)
        if RESIDUAL:
            out = out.to(act).to(tl.float32) + tl.load(r_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(o_ptr + rows, out.to(act), mask=row_ok)

    @triton.autotune(configs=_CONFIGS, key=["N", "K", "INT8", "NORM", "SWIGLU"])
    @triton.jit
    def _gemv_kernel(
        x_ptr, w_ptr, s_ptr, o_ptr, nw_ptr, r_ptr, b_ptr, N, K, stride_wn, eps, INT8: tl.constexpr,
        NORM: tl.constexpr, RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr, BIAS: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        cols = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        x_sums = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            ks = k + cols
            x = tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
            if NORM:  # W (x rstd w) = rstd W (x w): the row's RMS is summed along and applied at the end
                squares += x * x
                x *= tl.load(nw_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
            mask = row_ok[:, None] & (ks[None, :] < K)
            w = tl.load(w_ptr + rows[:, None] * stride_wn + ks[None, :], mask=mask, other=0)
            if INT8:  # 1.5 + q / 256, built in the mantissa (module docstring)
                x_sums += x
                w = ((w.to(tl.int32) << 15) + 0x3FC00000).to(tl.float32, bitcast=True)
            acc += w.to(tl.float32) * x[None, :]
            if SWIGLU:  # the matching "up" rows sit N rows below the "gate" rows
                up = tl.load(w_ptr + (rows[:, None] + N) * stride_wn + ks[None, :], mask=mask, other=0)
                if INT8:
                    up = ((up.to(tl.int32) << 15) + 0x3FC00000).to(tl.float32, bitcast=True)
                acc_up += up.to(tl.float32) * x[None, :]
        rstd = 1.0
        if NORM:
            rstd = 1.0 / tl.sqrt(tl.sum(squares, 0) / K + eps)
        out = tl.sum(acc, 1)
        up_out = tl.sum(acc_up, 1)
        if INT8:
            offset = 1.5 * tl.sum(x_sums, 0)
            out = 256.0 * (out - offset) * tl.load(s_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
            if SWIGLU:
                up_scale = tl.load(s_ptr + rows + N, mask=row_ok, other=0.0).to(tl.float32)
                up_out = 256.0 * (up_out - offset) * up_scale
        _finish(out * rstd, up_out * rstd, rows, row_ok, o_ptr, r_ptr, b_ptr, RESIDUAL, SWIGLU, BIAS)

    _INT4_CONFIGS = [  # (BLOCK_N, BLOCK_G groups per step, warps, stages)
        triton.Config({"BLOCK_N": n, "BLOCK_G": g}, num_warps=w, num_stages=s)
        for n, g, w, s in ((4, 32, 4, 3), (8, 16, 4, 3), (2, 64, 4, 3), (16, 8, 4, 3), (8, 32, 8, 3),
                           (4, 64, 8, 3), (16, 16, 8, 3), (1, 128, 4, 3), (2, 128, 8, 2), (8, 8, 2, 4),
                           (4, 16, 2, 4), (32, 8, 8, 3))
    ]  # fmt: skip

    @triton.jit
    def _int4_group_sums(
        w_ptr, s_ptr, m_ptr, rows, ok, mask3, byte, g, x_lo, x_hi, x_sum, stride_wn, stride_sn,
    ):  # fmt: skip
        """Per (row, group) of this step: the group's sum of w x, with w = q * scale + min."""
        p = tl.load(w_ptr + rows[:, None, None] * stride_wn + byte[None, :, :], mask=mask3, other=0)
        p = p.to(tl.int32)
        lo = (((p << 19) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + q / 16, even k
        hi = (((p << 15) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)  # odd k
        a = tl.sum(lo * x_lo[None, :, :] + hi * x_hi[None, :, :], 2)
        where = rows[:, None] * stride_sn + g[None, :]
        scale = tl.load(s_ptr + where, mask=ok, other=0.0).to(tl.float32)
        low = tl.load(m_ptr + where, mask=ok, other=0.0).to(tl.float32)
        return 16.0 * scale * (a - x_sum[None, :]) + low * x_sum[None, :]

    @triton.autotune(configs=_INT4_CONFIGS, key=["N", "K", "NORM", "SWIGLU"])
    @triton.jit
    def _gemv_int4_kernel(
        x_ptr, w_ptr, s_ptr, m_ptr, o_ptr, nw_ptr, r_ptr, b_ptr, N, K, stride_wn, stride_sn, eps,
        GROUP: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr,
        BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
    ):  # fmt: skip
        """Weight [N, K / 2] bytes, byte j holding k = 2j (low nibble) and 2j + 1; tiles of [BLOCK_N rows,
        BLOCK_G groups, GROUP / 2 bytes], so a group's bytes sit in one thread and its sums need no shuffle."""
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        groups = tl.arange(0, BLOCK_G)
        pairs = tl.arange(0, GROUP // 2)
        acc = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
        squares = tl.zeros([BLOCK_G, GROUP // 2], dtype=tl.float32)
        for g0 in range(0, K // GROUP, BLOCK_G):
            g = g0 + groups
            g_ok = g < K // GROUP
            byte = g[:, None] * (GROUP // 2) + pairs[None, :]  # [BLOCK_G, GROUP / 2] offsets in a row
            x_lo = tl.load(x_ptr + 2 * byte, mask=g_ok[:, None], other=0.0).to(tl.float32)
            x_hi = tl.load(x_ptr + 2 * byte + 1, mask=g_ok[:, None], other=0.0).to(tl.float32)
            if NORM:
                squares += x_lo * x_lo + x_hi * x_hi
                x_lo *= tl.load(nw_ptr + 2 * byte, mask=g_ok[:, None], other=0.0).to(tl.float32)
                x_hi *= tl.load(nw_ptr + 2 * byte + 1, mask=g_ok[:, None], other=0.0).to(tl.float32)
            x_sum = tl.sum(x_lo + x_hi, 1)
            ok = row_ok[:, None] & g_ok[None, :]
            mask3 = ok[:, :, None] & (pairs[None, None, :] >= 0)
            acc += _int4_group_sums(w_ptr, s_ptr, m_ptr, rows, ok, mask3, byte, g, x_lo, x_hi, x_sum,
                                    stride_wn, stride_sn)  # fmt: skip
            if SWIGLU:  # the matching "up" rows sit N rows below the "gate" rows
                acc_up += _int4_group_sums(w_ptr, s_ptr, m_ptr, rows + N, ok, mask3, byte, g, x_lo, x_hi,
                                           x_sum, stride_wn, stride_sn)  # fmt: skip
        rstd = 1.0
        if NORM:
            rstd = 1.0 / tl.sqrt(tl.sum(tl.sum(squares, 1), 0) / K + eps)
        _finish(tl.sum(acc, 1) * rstd, tl.sum(acc_up, 1) * rstd, rows, row_ok, o_ptr, r_ptr, b_ptr,
                RESIDUAL, SWIGLU, BIAS)  # fmt: skip


def _launch(kernel, n: int, interpret_config: dict, *args, **constants) -> None:  # noqa: ANN001 (Triton kernel)
    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(n, meta["BLOCK_N"]),)

    if triton.knobs.runtime.interpret:
        kernel.fn[grid(interpret_config)](*args, **constants, **interpret_config)
    else:
        kernel[grid](*args, **constants)


def gemv(
    x: Tensor, weight: Tensor, scale: Tensor | None = None, *, bias: Tensor | None = None,
    norm: Tensor | None = None, eps: float = 0.0, residual: Tensor | None = None, swiglu: bool = False,
) -> Tensor:  # fmt: skip
    """x [1, K] @ weight[N, K].T → [1, N] in x's dtype, for a bf16/fp16 weight, an int8 weight with per-row
    `scale` [N], or a nibble-packed int4 weight (uint8 [N, K / 2], quant_triton.pack_int4) with `scale`
    [2, N, K / group] holding each group's scale and min (w = q * scale + min).

    Fused extras for the batch-1 decode layer (model.py): `norm` applies RMSNorm (that weight, `eps`) to x
    first; `bias` is added; `swiglu` reads a fused [gate; up] weight of 2N' rows and returns
    silu(gate) * up [1, N']; `residual` [1, N] is added to the result."""
    x = x.contiguous()
    rows = weight.shape[0] // 2 if swiglu else weight.shape[0]
    out = torch.empty(1, rows, dtype=x.dtype, device=x.device)
    extras = (x if norm is None else norm, x if residual is None else residual, x if bias is None else bias)
    flags = {
        "NORM": norm is not None,
        "RESIDUAL": residual is not None,
        "SWIGLU": swiglu,
        "BIAS": bias is not None,
    }
    if weight.dtype == torch.uint8:
        k = 2 * weight.shape[1]
        _launch(_gemv_int4_kernel, rows, _INTERPRET_INT4_CONFIG, x, weight, scale[0], scale[1], out, *extras,
                rows, k, weight.stride(0), scale.stride(1), eps, GROUP=k // scale.shape[2], **flags)  # fmt: skip
        return out
    _launch(_gemv_kernel, rows, _INTERPRET_CONFIG, x, weight, weight if scale is None else scale, out, *extras,
            rows, weight.shape[1], weight.stride(0), eps, INT8=scale is not None, **flags)  # fmt: skip
    return out
