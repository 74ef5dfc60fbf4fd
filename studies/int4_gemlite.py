"""int4 layers on GemLite's Triton kernels (CUDA; measured by studies/engine_gpu_int4_kernels.py, not in the engine).

GemLite (Apache-2.0, `pip install gemlite`, pure Python over Triton) ships low-bit matmuls tuned per shape:
a "reverse split-K" GEMV for one to four rows, split-K GEMMs up to 64 and a tiled GEMM above. The layer
holds GemLite's packed codes with our grouped asymmetric int4 (`quant.quantize_int4`): GemLite's
fused-multiply-add mode dequantizes q * scale + min, so the bf16 (scale, min) pairs are handed over as they
are, and the layer computes the same function as `Int4Linear` up to bf16 rounding of the sums.

Triton autotunes each (rows, shape) on its first call, outside the timed graph.
"""

import torch
from torch import Tensor, nn

from backends.local_engine.kernels.quantize import quantize_int4


class GemliteInt4Linear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None, group_size: int) -> None:
        super().__init__()
        from gemlite.core import DType, GemLiteLinearTriton

        out_features, in_features = weight.shape
        q, scales_and_zeros = quantize_int4(weight.float(), group_size)
        scale, zero = scales_and_zeros.unbind(-1)  # [K / group, N]; zero is min + 8 * scale
        low = (zero - 8.0 * scale).bfloat16()
        scale = scale.bfloat16()
        layer = GemLiteLinearTriton(
            4, group_size=group_size, in_features=in_features, out_features=out_features,
            input_dtype=DType.BF16, output_dtype=DType.BF16,
        )  # fmt: skip
        # pack() turns zeros z into the fma term -z * scale; hand it -min / scale, then put the exact min back.
        layer.pack(q.to(torch.uint8), scale.t(), (-low.float() / scale.float()).t().bfloat16(), bias=None)
        if layer.W_group_mode != 4 or layer.zeros.shape != low.shape:
            raise RuntimeError(f"GemLite packed int4 in an unexpected layout (mode {layer.W_group_mode})")
        layer.zeros.data.copy_(low)
        self.layer = layer
        self.bias = None if bias is None else nn.Parameter(bias.bfloat16(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        out = self.layer(x.reshape(-1, shape[-1]).bfloat16()).to(x.dtype)
        out = out.reshape(*shape[:-1], out.shape[-1])
        return out if self.bias is None else out + self.bias.to(x.dtype)
