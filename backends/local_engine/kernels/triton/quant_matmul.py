"""Weight-only int8 / int4 matmuls in Triton: y = x @ W.T (+ bias), W read as its quantized bytes.

Weight formats (the engine's quantizers in quant.py, plus one packing for int4):
- int8: `q` int8 [N, K] row-major (one output channel per row), `scale` [N] (fp32 or bf16):
  W[n, k] = q[n, k] * scale[n] (quant.quantize_int8).
- int4: `packed` uint8 [N, K / 2] from `pack_int4(q)`: byte j of row n holds input k = 2j in its low
  nibble and k = 2j + 1 in its high nibble; `scales_and_zeros` [K / G, N, 2] (fp32, bf16 or fp16; bf16
  halves its bytes): W[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n] with g = k // G
  (quant.quantize_int4). G (group_size) is a power of two >= 32.

Two kernels per format, chosen by the row count M of x (`choose_config`):
- M = 1 ("gemv", block_m 1): CUDA cores, one row of x per program, a [BLOCK_N, BLOCK_K] weight tile per
  step multiplied into that row in fp32. int4 sums (q - 8)·x per group and applies the group's scale and
  zero to that sum: Σ ((q - 8)·s + z)·x over a group is s·Σ(q - 8)·x + z·Σx. (Earlier versions also
  took 2-4 rows here; their 4-D register tiles compiled to per-step shared-memory layout shuffles.)
- M > 1 ("gemm"): tensor cores (tl.dot), the weight tile dequantized in registers to x's dtype; int4
  walks one group at a time, its even and odd inputs as two dots against the low and high nibbles.
Split-K (`split_k` > 1) cuts K into slices run by separate programs into an fp32 workspace summed by torch
afterwards (deterministic): for small M and N, where N / BLOCK_N programs leave SMs idle.
fp32 x runs the dots in IEEE fp32 (no TF32). Every config field can be overridden per call.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
from torch import Tensor

import backends.local_engine.kernels.triton.quant_kernels as quant_kernels

GEMV_MAX_ROWS = 1


@dataclass(frozen=True)
class MatmulConfig:
    block_m: int  # 1: gemv (one row of x per program); gemm: 16 or more
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

    M = 1 on CUDA is autotuned instead (`GEMV_TUNING`) unless a config is passed; this entry is the
    fallback (interpreter, explicit calls): [32, 256] int8 / [32, 512] int4 tiles, no split. The first H200
    run (bench/engine_gpu.py, 06:40 UTC) measured the earlier picks (N tiles narrowed to 8-16 and split-K
    for N < 8 programs per SM) at 0.2-1.0 TB/s on the 8B projections against 2.98 TB/s (int8) and 1.73
    TB/s (int4) for [32, 256] / [32, 512] tiles on the output layer. The gemm rows: split-K until ~8
    programs per SM while the split's fp32 workspace traffic stays under half the weight bytes.
    """
    if m <= GEMV_MAX_ROWS:  # measured on the H200: BN 32 streams 2.98 TB/s (int8) on the output layer
        return MatmulConfig(1, 32, max(group_size, 512) if group_size else 256, num_warps=4, num_stages=1)
    elif m <= 16:
        config = MatmulConfig(16, 64, max(128, group_size), num_warps=4, num_stages=4)
    elif m <= 64:
        config = MatmulConfig(64, 64, max(64, group_size), num_warps=4, num_stages=3)
    else:
        config = MatmulConfig(128, 128, max(64, group_size), num_warps=8, num_stages=3)
    programs = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    weight_bytes_per_row = k // 2 if group_size else k  # per output column
    split_k = 1
    while (
        programs * split_k < 8 * num_sms
        and k // (2 * split_k) >= 2 * config.block_k
        and split_k < 16
        and 32 * split_k * m
        <= weight_bytes_per_row  # the doubled split's fp32 workspace write + read <= 1/2 the weights
    ):
        split_k *= 2
    return replace(config, split_k=split_k)


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
    if config is None and m <= GEMV_MAX_ROWS and x.is_cuda:
        return _tuned_gemv(x2, weight, scales, bias, n, group_size).view(*lead, n)
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
    if config.gemv:  # the K loop's own pipelining depth (loads feeding no dot are not pipelined otherwise)
        extra = {"NUM_STAGES": config.num_stages}
    else:
        extra = {"DOT_PRECISION": "ieee" if x.dtype == torch.float32 else "tf32"}
    bias_arg = out if bias is None else bias
    if group_size:
        kernel = quant_kernels.int4_gemv_kernel if config.gemv else quant_kernels.int4_gemm_kernel
        kernel[grid](
            x2, weight, scales, bias_arg, target, m, n, k, x2.stride(0), weight.stride(0), scales.stride(0),
            scales.stride(1), out.stride(0), GROUP=group_size, **common, **extra,
        )  # fmt: skip
    else:
        kernel = quant_kernels.int8_gemv_kernel if config.gemv else quant_kernels.int8_gemm_kernel
        kernel[grid](
            x2, weight, scales, bias_arg, target, m, n, k, x2.stride(0), weight.stride(0), out.stride(0),
            **common, **extra,
        )  # fmt: skip
    if config.split_k > 1:
        summed = target.sum(0)
        out.copy_(summed if bias is None else summed + bias.float())
    return out.view(*lead, n)


# M = 1 on CUDA: (block_n, block_k, pipeline stages) tried per (N, K) on the first call (triton.autotune;
# run it once before capturing a CUDA graph). Tiles of the gpu helper's kernels/triton/gemv.py, which streamed
# 1.5-2.3 TB/s on the 8B projections, plus the [32, 256] tile measured at 2.98 TB/s on the output layer.
GEMV_TUNING = [(4, 1024, 1), (8, 512, 1), (8, 1024, 1), (16, 256, 1), (16, 512, 1), (32, 256, 1), (8, 1024, 3),
               (16, 512, 3), (32, 256, 3)]  # fmt: skip
_TUNED: dict[int, object] = {}


def gemv_autotuner(group_size: int, do_bench: Callable | None = None) -> object:
    """The M = 1 kernel for int8 (group_size 0) or int4 wrapped in triton.autotune over GEMV_TUNING."""
    configs = {
        (block_n, max(block_k, group_size), stages): triton.Config(
            {"BLOCK_N": block_n, "BLOCK_K": max(block_k, group_size), "NUM_STAGES": stages},
            num_warps=4,
            num_stages=stages,
        )  # fmt: skip
        for block_n, block_k, stages in GEMV_TUNING
    }
    kernel = quant_kernels.int4_gemv_kernel if group_size else quant_kernels.int8_gemv_kernel
    return triton.autotune(configs=list(configs.values()), key=["N", "K"], do_bench=do_bench)(kernel)


def _tuned_gemv(
    x: Tensor, weight: Tensor, scales: Tensor, bias: Tensor | None, n: int, group_size: int
) -> Tensor:
    if group_size not in _TUNED:
        _TUNED[group_size] = gemv_autotuner(group_size)
    m, k = x.shape
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    tuned = _TUNED[group_size][lambda meta: (m, triton.cdiv(n, meta["BLOCK_N"]), 1)]
    bias_arg = out if bias is None else bias
    if group_size:
        tuned(x, weight, scales, bias_arg, out, m, n, k, x.stride(0), weight.stride(0), scales.stride(0),
              scales.stride(1), out.stride(0), GROUP=group_size, HAS_BIAS=bias is not None, BLOCK_M=1, SPLIT_K=1)  # fmt: skip
    else:
        tuned(x, weight, scales, bias_arg, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
              HAS_BIAS=bias is not None, BLOCK_M=1, SPLIT_K=1)  # fmt: skip
    return out
