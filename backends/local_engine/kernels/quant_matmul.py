"""Weight-only int8 / int4 matmuls in Triton: y = x @ W.T (+ bias), W read as its quantized bytes.

Weight formats (the engine's quantizers in quant.py, plus one packing for int4):
- int8: `q` int8 [N, K] row-major (one output channel per row), `scale` [N] (fp32 or bf16):
  W[n, k] = q[n, k] * scale[n] (quant.quantize_int8).
- int4: `packed` uint8 [N, K / 2] from `pack_int4(q)`: byte j of row n holds input k = 2j in its low
  nibble and k = 2j + 1 in its high nibble; `scales_and_zeros` [K / G, N, 2] (fp32, bf16 or fp16; bf16
  halves its bytes): W[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n] with g = k // G
  (quant.quantize_int4). G (group_size) is a power of two >= 32.

Two kernels per format, chosen by the row count M of x (`choose_config`):
- M <= 4 ("gemv"): CUDA cores, one [BLOCK_N, BLOCK_K] weight tile per step multiplied into every row
  (broadcast multiply + sums in fp32). int4 sums (q - 8)·x per group and applies the group's scale and
  zero to that sum: Σ ((q - 8)·s + z)·x over a group is s·Σ(q - 8)·x + z·Σx.
- M > 4 ("gemm"): tensor cores (tl.dot), the weight tile dequantized in registers to x's dtype; int4
  walks one group at a time, its even and odd inputs as two dots against the low and high nibbles.
Split-K (`split_k` > 1) cuts K into slices run by separate programs into an fp32 workspace summed by torch
afterwards (deterministic): for small M and N, where N / BLOCK_N programs leave SMs idle.
fp32 x runs the dots in IEEE fp32 (no TF32). Every config field can be overridden per call.
"""

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from torch import Tensor

GEMV_MAX_ROWS = 4


@dataclass(frozen=True)
class MatmulConfig:
    block_m: int  # gemv: rows padded to a power of two <= GEMV_MAX_ROWS; gemm: >= 16
    block_n: int
    block_k: int  # K per loop step (int4: a multiple of the group size)
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    @property
    def gemv(self) -> bool:
        return self.block_m <= GEMV_MAX_ROWS


_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (132 on an H200); 132 off CUDA (interpreter tests)."""
    if device.type != "cuda":
        return 132
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def choose_config(m: int, n: int, k: int, num_sms: int, group_size: int = 0) -> MatmulConfig:
    """Tile table keyed by M: untuned guesses for an H200, to be replaced by measured ones.

    Small M is bandwidth-bound and needs many programs in flight: the gemv path narrows its N tile down
    to 8 rows, then splits K, until there are ~8 programs per SM; its K step keeps the per-step product
    at 8K fp32 elements (int4: 16K inputs, as each byte holds two).
    """
    if m <= GEMV_MAX_ROWS:
        rows = triton.next_power_of_2(m)
        block_n = 32
        while triton.cdiv(n, block_n) < 8 * num_sms and block_n > 8:
            block_n //= 2
        block_k = max(group_size, min(1024, (16384 if group_size else 8192) // (rows * block_n)))
        config = MatmulConfig(rows, block_n, block_k, num_warps=4)
    elif m <= 16:
        config = MatmulConfig(16, 64, max(128, group_size), num_warps=4, num_stages=4)
    elif m <= 64:
        config = MatmulConfig(64, 64, max(64, group_size), num_warps=4, num_stages=3)
    else:
        config = MatmulConfig(128, 128, max(64, group_size), num_warps=8, num_stages=3)
    programs = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    split_k = 1
    while programs * split_k < 8 * num_sms and k // (2 * split_k) >= 2 * config.block_k and split_k < 16:
        split_k *= 2
    return replace(config, split_k=split_k)


@triton.jit
def _k_range(K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """[start, end) of this program's K slice, in whole BLOCK_K steps."""
    per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
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
        tl.store(
            out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask
        )
    else:
        part = out_ptr + tl.program_id(2) * M * N
        tl.store(part + rows[:, None] * N + cols[None, :], acc, mask=mask)


@triton.jit
def _int8_kernel(
    x_ptr, q_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_qn, stride_om,
    HAS_BIAS: tl.constexpr, GEMV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    k_start, k_end = _k_range(K, BLOCK_K, SPLIT_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_end
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        if GEMV:  # q tile [N, K]: each row of x times every weight row, summed over K
            q = tl.load(
                q_ptr + cols[:, None] * stride_qn + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0
            )
            acc += tl.sum(x.to(tl.float32)[:, None, :] * q.to(tl.float32)[None, :, :], axis=2)
        else:  # q tile [K, N] dequantized (exactly: |q| <= 127) to x's dtype for the tensor cores
            q = tl.load(
                q_ptr + cols[None, :] * stride_qn + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0
            )
            acc = tl.dot(x, q.to(x.dtype), acc, input_precision=DOT_PRECISION)
    acc *= tl.load(scale_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    _store(out_ptr, acc, rows, cols, M, N, stride_om, bias_ptr, HAS_BIAS, SPLIT_K)


@triton.jit
def _int4_gemv_kernel(
    x_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_szg, stride_szn, stride_om,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    """Few rows: a [BLOCK_N, groups, GROUP / 2] byte tile per step; Σ (q - 8)·x per group, then the group's
    scale times that sum plus its zero times Σx (fp32 throughout)."""
    HALF: tl.constexpr = GROUP // 2
    GROUPS: tl.constexpr = BLOCK_K // GROUP
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    k_start, k_end = _k_range(K, BLOCK_K, SPLIT_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    group = tl.arange(0, GROUPS)
    half = tl.arange(0, HALF)
    pairs = group[:, None] * HALF + half[None, :]  # [GROUPS, HALF] byte of the step
    for k0 in range(k_start, k_end, BLOCK_K):
        group_ok = k0 + group * GROUP < k_end  # K % GROUP == 0: a group is inside K or past it
        x_tile = x_ptr + rows[:, None, None] * stride_xm + k0 + 2 * pairs[None, :, :]
        x_mask = row_ok[:, None, None] & group_ok[None, :, None]
        x_even = tl.load(x_tile, mask=x_mask, other=0.0).to(tl.float32)  # [BLOCK_M, GROUPS, HALF]
        x_odd = tl.load(x_tile + 1, mask=x_mask, other=0.0).to(tl.float32)
        w_tile = w_ptr + cols[:, None, None] * stride_wn + k0 // 2 + pairs[None, :, :]
        w_mask = col_ok[:, None, None] & group_ok[None, :, None]
        codes = tl.load(w_tile, mask=w_mask, other=0)  # [BLOCK_N, GROUPS, HALF] uint8
        low = (codes & 0xF).to(tl.float32) - 8.0
        high = (codes >> 4).to(tl.float32) - 8.0
        products = x_even[:, None, :, :] * low[None, :, :, :] + x_odd[:, None, :, :] * high[None, :, :, :]
        dots = tl.sum(products, axis=3)  # [BLOCK_M, BLOCK_N, GROUPS]
        x_sums = tl.sum(x_even + x_odd, axis=2)  # [BLOCK_M, GROUPS]
        sz = sz_ptr + (k0 // GROUP + group[None, :]) * stride_szg + cols[:, None] * stride_szn
        sz_mask = col_ok[:, None] & group_ok[None, :]
        scale = tl.load(sz, mask=sz_mask, other=0.0).to(tl.float32)  # [BLOCK_N, GROUPS]
        zero = tl.load(sz + 1, mask=sz_mask, other=0.0).to(tl.float32)
        acc += tl.sum(dots * scale[None, :, :] + x_sums[:, None, :] * zero[None, :, :], axis=2)
    _store(out_ptr, acc, rows, cols, M, N, stride_om, bias_ptr, HAS_BIAS, SPLIT_K)


@triton.jit
def _int4_gemm_kernel(
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
            x_mask = row_ok[:, None] & group_ok
            x_even = tl.load(x_rows, mask=x_mask, other=0.0)
            x_odd = tl.load(x_rows + 1, mask=x_mask, other=0.0)
            sz = sz_ptr + (k_group // GROUP) * stride_szg + cols * stride_szn
            scale = tl.load(sz, mask=col_ok & group_ok, other=0.0).to(tl.float32)[None, :]
            zero = tl.load(sz + 1, mask=col_ok & group_ok, other=0.0).to(tl.float32)[None, :]
            w_tile = w_ptr + cols[None, :] * stride_wn + k_group // 2 + half[:, None]
            codes = tl.load(w_tile, mask=col_ok[None, :] & group_ok, other=0)
            low = ((codes & 0xF).to(tl.float32) - 8.0) * scale + zero
            high = ((codes >> 4).to(tl.float32) - 8.0) * scale + zero
            acc = tl.dot(x_even, low.to(x_even.dtype), acc, input_precision=DOT_PRECISION)
            acc = tl.dot(x_odd, high.to(x_odd.dtype), acc, input_precision=DOT_PRECISION)
    _store(out_ptr, acc, rows, cols, M, N, stride_om, bias_ptr, HAS_BIAS, SPLIT_K)


def int8_matmul(
    x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None, *, config: MatmulConfig | None = None
) -> Tensor:
    """x [..., K] @ (q * scale[:, None]).T (+ bias) → [..., N] in x's dtype; q int8 [N, K], scale [N]."""
    if q.dtype != torch.int8 or q.dim() != 2 or q.shape[1] != x.shape[-1] or q.stride(1) != 1:
        raise ValueError(
            f"int8 weight must be int8 [N, {x.shape[-1]}] row-major, got {q.dtype} {tuple(q.shape)}"
        )
    return _launch(x, q, scale, bias, q.shape[0], 0, config)


def int4_matmul(
    x: Tensor, packed: Tensor, scales_and_zeros: Tensor, group_size: int, bias: Tensor | None = None,
    *, config: MatmulConfig | None = None,
) -> Tensor:  # fmt: skip
    """x [..., K] @ W.T (+ bias) → [..., N] in x's dtype; packed uint8 [N, K/2] (pack_int4),
    scales_and_zeros [K/G, N, 2]."""
    k = x.shape[-1]
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] * 2 != k or packed.stride(1) != 1:
        raise ValueError(f"int4 weight must be uint8 [N, {k // 2}] from pack_int4, got {tuple(packed.shape)}")
    if group_size < 32 or group_size & (group_size - 1) or k % group_size:
        raise ValueError(f"int4 group size must be a power of two >= 32 dividing K={k}, got {group_size}")
    if scales_and_zeros.shape != (k // group_size, packed.shape[0], 2) or scales_and_zeros.stride(2) != 1:
        raise ValueError(f"scales_and_zeros must be [{k // group_size}, {packed.shape[0]}, 2]")
    return _launch(x, packed, scales_and_zeros, bias, packed.shape[0], group_size, config)


def _launch(
    x: Tensor, weight: Tensor, scales: Tensor, bias: Tensor | None, n: int, group_size: int,
    config: MatmulConfig | None,
) -> Tensor:  # fmt: skip
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    config = config or choose_config(m, n, k, sm_count(x.device), group_size)
    if group_size and config.block_k % group_size:
        raise ValueError(f"block_k {config.block_k} must be a multiple of the int4 group size {group_size}")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    target = out
    if config.split_k > 1:
        target = torch.empty(config.split_k, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, config.block_m), triton.cdiv(n, config.block_n), config.split_k)
    common = dict(
        HAS_BIAS=bias is not None, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT_K=config.split_k, num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    bias_arg = out if bias is None else bias
    if group_size:
        kernel = _int4_gemv_kernel if config.gemv else _int4_gemm_kernel
        extra = {} if config.gemv else {"DOT_PRECISION": precision}
        kernel[grid](
            x2, weight, scales, bias_arg, target, m, n, k, x2.stride(0), weight.stride(0), scales.stride(0),
            scales.stride(1), out.stride(0), GROUP=group_size, **common, **extra,
        )  # fmt: skip
    else:
        _int8_kernel[grid](
            x2, weight, scales, bias_arg, target, m, n, k, x2.stride(0), weight.stride(0), out.stride(0),
            GEMV=config.gemv, DOT_PRECISION=precision, **common,
        )  # fmt: skip
    if config.split_k > 1:
        summed = target.sum(0)
        out.copy_(summed if bias is None else summed + bias.float())
    return out.view(*lead, n)
