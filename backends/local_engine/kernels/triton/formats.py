"""Quantized weight formats the Triton matmuls read, packing and embedding lookups (plain torch).

int8: quant.quantize_int8's (q int8 [N, K], scale [N]). int4: quant.quantize_int4's codes packed two per
byte by `pack_int4` (low nibble = even input), with its scales_and_zeros [K / G, N, 2].
Embedding lookups need no matmul: `int8_rows` / `int4_rows` dequantize only the looked-up rows.
"""

import torch
from torch import Tensor

from backends.local_engine.kernels.quantize import quantize_int4


def pack_int4(q: Tensor) -> Tensor:
    """int codes 0..15 [N, K] → uint8 [N, K/2]: low nibble input 2j, high nibble input 2j + 1."""
    codes = q.to(torch.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: Tensor) -> Tensor:
    """Inverse of pack_int4: uint8 [N, K/2] → int32 codes [N, K]."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(1).to(torch.int32)


def quantize_int4_packed(
    weight: Tensor, group_size: int, scale_dtype: torch.dtype = torch.bfloat16
) -> tuple[Tensor, Tensor]:
    """Float weight [N, K] → (packed uint8 [N, K/2], scales_and_zeros [K/G, N, 2] in `scale_dtype`)."""
    q, scales_and_zeros = quantize_int4(weight.float(), group_size)
    return pack_int4(q), scales_and_zeros.to(scale_dtype)


def int8_rows(ids: Tensor, q: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """Embedding lookup of int8 rows: q[ids] * scale[ids] → [..., K] in `dtype` (reads only those rows)."""
    return (q[ids].float() * scale[ids].float().unsqueeze(-1)).to(dtype)


def int4_rows(
    ids: Tensor, packed: Tensor, scales_and_zeros: Tensor, group_size: int, dtype: torch.dtype
) -> Tensor:
    """Embedding lookup of int4 rows (packed as above) → [..., K] in `dtype`."""
    flat = ids.reshape(-1)
    codes = unpack_int4(packed[flat]).float().view(flat.shape[0], -1, group_size)
    scale, zero = scales_and_zeros[:, flat].float().transpose(0, 1).unbind(-1)  # [rows, K/G] each
    rows = (codes - 8.0) * scale.unsqueeze(-1) + zero.unsqueeze(-1)
    return rows.reshape(*ids.shape, -1).to(dtype)


def matmul_bytes_flops(
    m: int, n: int, k: int, weight_bits: int, group_size: int, scale_bytes: int, act_bytes: int
) -> tuple[int, int]:
    """(bytes moved at least, FLOPs) of one call: weights once (+ scales), x read, y written; 2·M·N·K."""
    weight = n * k * weight_bits // 8
    scales = n * (k // group_size) * 2 * scale_bytes if group_size else n * scale_bytes
    return weight + scales + (m * k + m * n) * act_bytes, 2 * m * n * k
