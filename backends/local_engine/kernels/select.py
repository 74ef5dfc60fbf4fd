"""Which layer (and so which kernel) a weight gets: `make_linear`, by format, device and the engine's
KernelSettings (config.py, where each default's measurement is named)."""

import torch
from torch import Tensor, nn

from backends.local_engine.config import DEFAULT_KERNELS, KernelSettings
from backends.local_engine.kernels.quant import DenseLinear, Fp16Linear, Int4Linear, Int8Linear


def make_linear(
    weight: Tensor, bias: Tensor | None, dtype: str, group_size: int, gate_up: bool = False,
    kernels: KernelSettings = DEFAULT_KERNELS,
) -> nn.Module:  # fmt: skip
    """Build the layer for `dtype` from a float32 weight already on its target device. `gate_up`: the weight
    is [gate; up] (int4_mma's layer stores it interleaved for its fused SwiGLU; others ignore it)."""
    cuda = weight.is_cuda
    if cuda and (dtype, getattr(kernels, f"{dtype}_cuda_kernel", None)) in (
        ("int8", "kernels"),
        ("int4", "kernels"),
    ):
        from backends.local_engine.kernels.triton import TritonInt4Linear, TritonInt8Linear

        if dtype == "int8":
            return TritonInt8Linear(weight, bias)
        return TritonInt4Linear(weight, bias, group_size)
    if dtype == "int8":
        return Int8Linear(weight, bias)
    if dtype == "int4" and cuda and kernels.int4_cuda_kernel == "mma":
        from backends.local_engine.kernels.cuda import int4_mma

        if int4_mma.supports(*weight.shape, group_size) and int4_mma.available():
            fused = gate_up and bias is None and kernels.int4_fused
            pdl = kernels.int4_pdl and torch.cuda.get_device_capability(weight.device)[0] >= 9
            return int4_mma.Int4MmaLinear(
                weight, bias, group_size, gate_up=fused, pdl=pdl, configs=kernels.int4_mma_configs
            )
    if dtype == "int4" and not cuda and cpu_int4_kernel(*weight.shape, group_size, kernels):
        from backends.local_engine.kernels.cpu.ops import Int4CpuLinear

        return Int4CpuLinear(weight, bias, group_size)
    if dtype == "int4":
        return Int4Linear(weight, bias, group_size, triton=cuda and kernels.int4_cuda_kernel == "triton")
    if dtype == "fp16":
        return Fp16Linear(weight, bias)
    return dense_linear(weight.to(torch.bfloat16 if dtype == "bf16" else torch.float32), bias, kernels)


def dense_linear(
    weight: Tensor, bias: Tensor | None, kernels: KernelSettings = DEFAULT_KERNELS
) -> DenseLinear:
    """A bf16/fp32 layer with the Triton GEMV / skinny matmul as `kernels` choose (CUDA bf16 only)."""
    return DenseLinear(weight, bias, gemv=kernels.bf16_gemv, skinny_rows=kernels.skinny_max_rows)


def cpu_int4_kernel(
    out_features: int, in_features: int, group_size: int, kernels: KernelSettings = DEFAULT_KERNELS
) -> bool:
    """Whether a CPU int4 layer of this shape runs kernels/cpu's kernel (else torch's packed one)."""
    from backends.local_engine.kernels.cpu import ops

    return ops.supports(out_features, in_features, group_size) and ops.available(kernels.int4_cpu_kernel)


def cpu_int8_kernel(out_features: int, in_features: int, kernels: KernelSettings = DEFAULT_KERNELS) -> bool:
    """Whether an int8 CPU layer of this shape can run kernels/cpu's int8 kernel (the int4 format's output
    layer uses it where the int4 kernel is used)."""
    return cpu_int4_kernel(out_features, in_features, 32, kernels)
