"""The engine's weight quantization math (no kernel): symmetric per-row int8 and asymmetric grouped int4.

Every kernel family (kernels/quant.py's torch layers, cpu/, cuda/, triton/) packs these same values.
"""

import torch
from torch import Tensor


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-row int8: weight ≈ q * scale[:, None]."""
    scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(weight: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """Asymmetric grouped int4 → (q int32 [N, K] in 0..15, scales_and_zeros [K/group, N, 2])."""
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise ValueError(f"in_features {in_features} not divisible by int4 group size {group_size}")
    groups = weight.reshape(out_features, in_features // group_size, group_size)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = (high - low).clamp(min=1e-6) / 15.0
    q = torch.round((groups - low) / scale).clamp(0, 15).to(torch.int32).reshape(out_features, in_features)
    zero = low + scale * 8.0  # the kernels dequantize as (q - 8) * scale + zero
    scales_and_zeros = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous()
    return q, scales_and_zeros


def dequantize_int4(q: Tensor, scales_and_zeros: Tensor, group_size: int) -> Tensor:
    out_features, in_features = q.shape
    scale, zero = scales_and_zeros.transpose(0, 1).unsqueeze(-1).unbind(dim=2)
    groups = (q.reshape(out_features, -1, group_size).float() - 8.0) * scale + zero
    return groups.reshape(out_features, in_features)
