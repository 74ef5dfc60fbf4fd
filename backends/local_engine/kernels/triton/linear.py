"""nn.Modules over the Triton quantized matmuls: drop-ins for quant.Int8Linear / Int4Linear on CUDA.

Built from a float weight [N, K] already on the GPU; they hold only the quantized bytes (int8 + fp32
per-row scales, or packed int4 + bf16 group scales and zeros), so weights.weight_bytes counts what each
forward reads. The output layer is the same module with N = vocab; embedding lookups use
formats.int8_rows / int4_rows on the same buffers (`QuantizedEmbedding`).
"""

import torch
from torch import Tensor, nn

from backends.local_engine.kernels.quantize import quantize_int8
from backends.local_engine.kernels.triton.formats import int4_rows, int8_rows, quantize_int4_packed
from backends.local_engine.kernels.triton.quant_matmul import MatmulConfig, int4_matmul, int8_matmul


class TritonInt8Linear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None, config: MatmulConfig | None = None) -> None:
        super().__init__()
        q, scale = quantize_int8(weight.float())
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if bias is None else bias.float())
        self.config = config  # None: quant_matmul.choose_config per call's row count

    def forward(self, x: Tensor) -> Tensor:
        return int8_matmul(x, self.q, self.scale, self.bias, config=self.config)


class TritonInt4Linear(nn.Module):
    def __init__(
        self, weight: Tensor, bias: Tensor | None, group_size: int, scale_dtype: torch.dtype = torch.bfloat16,
        config: MatmulConfig | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        packed, scales_and_zeros = quantize_int4_packed(weight, group_size, scale_dtype)
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", None if bias is None else bias.float())
        self.group_size, self.config = group_size, config

    def forward(self, x: Tensor) -> Tensor:
        return int4_matmul(
            x, self.packed, self.scales_and_zeros, self.group_size, self.bias, config=self.config
        )


class QuantizedEmbedding(nn.Module):
    """Token embeddings read from a TritonInt8Linear / TritonInt4Linear's buffers (tied output layer)."""

    def __init__(self, table: TritonInt8Linear | TritonInt4Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.table, self.dtype = table, dtype

    def forward(self, ids: Tensor) -> Tensor:
        table = self.table
        if isinstance(table, TritonInt8Linear):
            return int8_rows(ids, table.q, table.scale, self.dtype)
        return int4_rows(ids, table.packed, table.scales_and_zeros, table.group_size, self.dtype)
