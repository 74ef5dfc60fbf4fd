"""int4 linear layers on x86 CPUs with AVX-512 VNNI: int4 codes x int8-quantized activations (issue 14).

Why hand-written: torch's `_weight_int4pack_mm_for_cpu` computes in bf16 and shares little work across rows
(bench/README.md, "Client table"); llama.cpp's Q4 x Q8 integer dot products do the same matmul faster on this
CPU. int4_cpu.cpp (compiled on first use by torch.utils.cpp_extension, with ninja and the system C++ compiler)
quantizes each activation row per group of 32 to int8 (its own scale, as llama.cpp's Q8_0) and takes the
integer dot of 64 codes per `vpdpbusd`; rows of a call share each unpacked code block. Weights keep the
engine's int4 format: codes 0..15 and bf16 (scale, zero) per group of 32, w = (q - 8) * scale + zero.

A row's result depends only on that row (its own activation scales, fixed summation order), so batching,
chunked prefill and speculative verification give the same logits as one-token decode. Where the CPU lacks
AVX-512 VNNI, the build fails, or the shape does not fit (K % 64, N % 4), `Int4Linear` keeps torch's kernel.
"""

import functools
import os
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from backends.local_engine.quant import quantize_int4

GROUP = 32
_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "fma", "f16c")


def cpu_supported() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    return all(flag in flags for flag in _FLAGS)


@functools.cache
def _extension():  # noqa: ANN202
    from torch.utils.cpp_extension import load_inline

    source = Path(__file__).with_name("int4_cpu.cpp").read_text()
    return load_inline(
        name="llmgw_int4_cpu",
        cpp_sources=source,
        functions=["int4_linear_cpu"],
        extra_cflags=[
            "-O3",
            "-fopenmp",
            "-mavx512f",
            "-mavx512bw",
            "-mavx512vl",
            "-mavx512dq",
            "-mavx512vnni",
            "-mfma",
            "-mf16c",
        ],
        extra_ldflags=["-fopenmp"],
    )


@functools.cache
def available() -> bool:
    """Whether this CPU runs the kernel and it builds here (LLMGW_INT4_CPU_KERNEL=torch turns it off)."""
    if os.environ.get("LLMGW_INT4_CPU_KERNEL", "vnni") == "torch" or not cpu_supported():
        return False
    try:
        _extension()
    except Exception as error:  # noqa: BLE001 - any build failure means: use torch's kernel
        warnings.warn(f"int4 CPU kernel unavailable, int4 uses torch's kernel: {error}", stacklevel=2)
        return False
    return True


def supports(out_features: int, in_features: int, group_size: int) -> bool:
    return group_size == GROUP and in_features % 64 == 0 and out_features % 4 == 0


def pack_codes(q: Tensor) -> Tensor:
    """Codes [N, K] in 0..15 → uint8 [N, K/2]: per 64 inputs, byte i = code i | code 32 + i << 4."""
    n, k = q.shape
    blocks = q.to(torch.uint8).view(n, k // 64, 2, 32)
    return (blocks[:, :, 0] | blocks[:, :, 1] << 4).reshape(n, k // 2).contiguous()


def int4_linear_cpu(x: Tensor, codes: Tensor, scales_and_zeros: Tensor) -> Tensor:
    """x [M, K] → float32 [M, N]."""
    return _extension().int4_linear_cpu(x.float().contiguous(), codes, scales_and_zeros)


class Int4CpuLinear(nn.Module):
    """Drop-in for quant.Int4Linear on a CPU where `available()`; holds codes and bf16 (scale, zero) only."""

    def __init__(self, weight: Tensor, bias: Tensor | None, group_size: int) -> None:
        super().__init__()
        out_features, in_features = weight.shape
        if not supports(out_features, in_features, group_size):
            raise ValueError(
                f"int4_cpu needs group 32, K % 64 == 0, N % 4 == 0; got {weight.shape}, {group_size}"
            )
        q, scales_and_zeros = quantize_int4(weight.float(), group_size)  # [K / group, N, 2]
        self.out_features = out_features
        self.register_buffer("codes", pack_codes(q))
        self.register_buffer("scales_and_zeros", scales_and_zeros.transpose(0, 1).contiguous().bfloat16())
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        out = int4_linear_cpu(x.reshape(-1, shape[-1]), self.codes, self.scales_and_zeros)
        out = out.to(x.dtype).reshape(*shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias.to(x.dtype)
