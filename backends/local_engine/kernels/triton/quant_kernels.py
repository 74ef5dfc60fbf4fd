"""The Triton programs behind quant_matmul.py (layouts and kernel choice are described there).

Program (i, j, s) computes rows i·BLOCK_M.., output columns j·BLOCK_N.. over K slice s of SPLIT_K.
Integer codes become floats without int-to-float conversion instructions (a quarter or less of the FMA
rate on recent GPUs): a code v in [0, 2^23) OR-ed into the bits of 2^23 is the float 2^23 + v, and one
exact subtraction leaves v - bias. The gemv kernels (one row of x per program) keep per-thread partial
sums across the K loop and reduce across threads once at the end; their weight loads are software-
pipelined NUM_STAGES deep (cp.async through shared memory; a plain loop issues none ahead).
"""

import triton
import triton.language as tl


@triton.jit
def _code_to_f32(v, BIAS: tl.constexpr):
    """int32 v in [0, 2^23) → float32 v - BIAS, exactly (bits of 2^23 + v, minus 2^23 + BIAS)."""
    return (v | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + BIAS)


@triton.jit
def _k_range(K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """[start, end) of this program's K slice, in whole BLOCK_K steps."""
    per_split = ((K + BLOCK_K - 1) // BLOCK_K + SPLIT_K - 1) // SPLIT_K * BLOCK_K
    start = tl.program_id(2) * per_split
    return start, tl.minimum(start + per_split, K)


@triton.jit
def _store(
    out_ptr, acc, rows, cols, M, N, stride_om, bias_ptr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr
):
    """acc [rows, cols] (scales applied) → out (+ bias), or the split's fp32 workspace slice."""
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        out = out_ptr + rows[:, None] * stride_om + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        part = out_ptr + tl.program_id(2) * M * N
        tl.store(part + rows[:, None] * N + cols[None, :], acc, mask=mask)


@triton.jit
def int8_gemv_kernel(
    x_ptr, q_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_qn, stride_om,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """One row of x per program (BLOCK_M = 1), CUDA cores: [BLOCK_N, BLOCK_K] fp32 partials x·q kept in
    registers over the K loop, summed across threads once at the end."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start, k_end = _k_range(K, BLOCK_K, SPLIT_K)
    partial = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_end
        x = tl.load(x_ptr + row * stride_xm + ks, mask=k_ok, other=0.0).to(tl.float32)
        q = tl.load(
            q_ptr + cols[:, None] * stride_qn + ks[None, :], mask=(cols[:, None] < N) & k_ok[None, :], other=0
        )
        partial += x[None, :] * _code_to_f32(q.to(tl.int32) + 128, 128.0)
    acc = tl.sum(partial, axis=1) * tl.load(scale_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    _store(out_ptr, acc[None, :], row + tl.arange(0, 1), cols, M, N, stride_om, bias_ptr, HAS_BIAS, SPLIT_K)


@triton.jit
def int8_gemm_kernel(
    x_ptr, q_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_qn, stride_om,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Tensor cores: the [BLOCK_K, BLOCK_N] code tile becomes x's dtype exactly (|q| <= 127), one dot."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start, k_end = _k_range(K, BLOCK_K, SPLIT_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_end
        x_tile = x_ptr + rows[:, None] * stride_xm + ks[None, :]
        x = tl.load(x_tile, mask=(rows[:, None] < M) & k_ok[None, :], other=0.0)
        q_tile = q_ptr + cols[None, :] * stride_qn + ks[:, None]
        q = tl.load(q_tile, mask=(cols[None, :] < N) & k_ok[:, None], other=0)
        w = _code_to_f32(q.to(tl.int32) + 128, 128.0).to(x.dtype)
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    acc *= tl.load(scale_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    _store(out_ptr, acc, rows, cols, M, N, stride_om, bias_ptr, HAS_BIAS, SPLIT_K)


@triton.jit
def int4_gemv_kernel(
    x_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_szg, stride_szn, stride_om,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """One row of x per program (BLOCK_M = 1), CUDA cores: a [BLOCK_N, groups, GROUP / 2] byte tile per
    step (a group's bytes sit in one thread's vector load, so its sum stays in the thread), Σ (q - 8)·x per
    group times the group's scale plus its zero times Σx, kept per group slot until the end."""
    HALF: tl.constexpr = GROUP // 2
    GROUPS: tl.constexpr = BLOCK_K // GROUP
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    k_start, k_end = _k_range(K, BLOCK_K, SPLIT_K)
    partial = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    group = tl.arange(0, GROUPS)
    pairs = group[:, None] * HALF + tl.arange(0, HALF)[None, :]  # [GROUPS, HALF] byte of the step
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        group_ok = k0 + group * GROUP < k_end  # K % GROUP == 0: a group is inside K or past it
        x_pairs = x_ptr + row * stride_xm + k0 + 2 * pairs
        x_even = tl.load(x_pairs, mask=group_ok[:, None], other=0.0).to(tl.float32)  # [GROUPS, HALF]
        x_odd = tl.load(x_pairs + 1, mask=group_ok[:, None], other=0.0).to(tl.float32)
        w_tile = w_ptr + cols[:, None, None] * stride_wn + k0 // 2 + pairs[None, :, :]
        codes = tl.load(w_tile, mask=col_ok[:, None, None] & group_ok[None, :, None], other=0).to(tl.int32)
        low = _code_to_f32(codes & 0xF, 8.0)  # [BLOCK_N, GROUPS, HALF]
        high = _code_to_f32(codes >> 4, 8.0)
        dots = tl.sum(x_even[None, :, :] * low + x_odd[None, :, :] * high, axis=2)  # [BLOCK_N, GROUPS]
        x_sums = tl.sum(x_even + x_odd, axis=1)[None, :]  # [1, GROUPS]
        sz = sz_ptr + (k0 // GROUP + group[None, :]) * stride_szg + cols[:, None] * stride_szn
        sz_mask = col_ok[:, None] & group_ok[None, :]
        scale = tl.load(sz, mask=sz_mask, other=0.0).to(tl.float32)  # [BLOCK_N, GROUPS]
        zero = tl.load(sz + 1, mask=sz_mask, other=0.0).to(tl.float32)
        partial += dots * scale + x_sums * zero
    acc = tl.sum(partial, axis=1)[None, :]
    _store(out_ptr, acc, row + tl.arange(0, 1), cols, M, N, stride_om, bias_ptr, HAS_BIAS, SPLIT_K)


@triton.jit
def int4_gemm_kernel(
    x_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_szg, stride_szn, stride_om,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Tensor cores, one group at a time: codes [GROUP / 2, BLOCK_N] dequantized in registers to x's dtype,
    then two dots, the group's even inputs against the low nibbles and its odd inputs against the high."""
    HALF: tl.constexpr = GROUP // 2
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    k_start, k_end = _k_range(K, BLOCK_K, SPLIT_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    half = tl.arange(0, HALF)
    for k0 in range(k_start, k_end, BLOCK_K):
        for step in tl.static_range(BLOCK_K // GROUP):
            k_group = k0 + step * GROUP
            group_ok = k_group < k_end
            x_rows = x_ptr + rows[:, None] * stride_xm + k_group + 2 * half[None, :]
            x_even = tl.load(x_rows, mask=row_ok[:, None] & group_ok, other=0.0)
            x_odd = tl.load(x_rows + 1, mask=row_ok[:, None] & group_ok, other=0.0)
            sz = sz_ptr + (k_group // GROUP) * stride_szg + cols * stride_szn
            scale = tl.load(sz, mask=col_ok & group_ok, other=0.0).to(tl.float32)[None, :]
            zero = tl.load(sz + 1, mask=col_ok & group_ok, other=0.0).to(tl.float32)[None, :]
            w_tile = w_ptr + cols[None, :] * stride_wn + k_group // 2 + half[:, None]
            codes = tl.load(w_tile, mask=col_ok[None, :] & group_ok, other=0).to(tl.int32)
            low = _code_to_f32(codes & 0xF, 8.0) * scale + zero
            high = _code_to_f32(codes >> 4, 8.0) * scale + zero
            acc = tl.dot(x_even, low.to(x_even.dtype), acc, input_precision=DOT_PRECISION)
            acc = tl.dot(x_odd, high.to(x_odd.dtype), acc, input_precision=DOT_PRECISION)
    _store(out_ptr, acc, rows, cols, M, N, stride_om, bias_ptr, HAS_BIAS, SPLIT_K)
