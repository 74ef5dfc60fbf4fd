"""Linear layers for each weight format: fp32/bf16 dense, int8 and int4 weight-only quantized.

int8: symmetric, one scale per output channel. int4: asymmetric, one (scale, zero) per group of
`group_size` input channels. Kernels for small batches (decode) on CPU are PyTorch's packed ones,
`torch._weight_int8pack_mm` and `aten._weight_int4pack_mm_for_cpu`, fed bf16 activations: on AVX2-only
CPUs their fp32-activation paths are scalar and 10x slower. From KERNEL_MAX_ROWS rows on (prefill),
dequantize + one GEMM is faster. CUDA: int4 uses `_weight_int4pack_mm` (bf16), int8 dequantizes.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

KERNEL_MAX_ROWS = 8
_INT4_INNER_K_TILES = 8
_INT4_BLOCK_ROWS = 32
_INT4_K_TILE = 16


class DenseLinear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.to(weight.dtype), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-row int8: weight ≈ q * scale[:, None]."""
    scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        q, scale = quantize_int8(weight.float())
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.register_buffer("scale_bf16", scale.bfloat16())

    def forward(self, x: Tensor) -> Tensor:
        if x.is_cpu and x.shape[0] <= KERNEL_MAX_ROWS:
            out = torch._weight_int8pack_mm(x.bfloat16(), self.q, self.scale_bf16).to(x.dtype)
        else:
            out = F.linear(x, self.q.to(x.dtype)) * self.scale.to(x.dtype)
        return out if self.bias is None else out + self.bias.to(x.dtype)


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


class Int4Linear(nn.Module):
    """Decode uses the packed kernel; CPU prefill unpacks the codes from that same packed tensor."""

    def __init__(self, weight: Tensor, bias: Tensor | None, group_size: int) -> None:
        super().__init__()
        q, scales_and_zeros = quantize_int4(weight.float(), group_size)
        self.group_size = group_size
        self.register_buffer("packed", _pack_int4(q))
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("scales_and_zeros_bf16", scales_and_zeros.bfloat16())
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        # codes kept unpacked only when the CPU packing is not the layout unpack_int4_cpu knows
        known_layout = not q.is_cpu or _unpacks_to(self.packed, q)
        self.register_buffer("codes", None if known_layout else q.to(torch.uint8))

    def forward(self, x: Tensor) -> Tensor:
        if self.packed.is_cpu and x.shape[0] > KERNEL_MAX_ROWS:
            out = F.linear(x, self._dequantized().to(x.dtype))
        elif self.packed.is_cpu:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.bfloat16(), self.packed, self.group_size, self.scales_and_zeros_bf16
            ).to(x.dtype)
        else:
            out = torch.ops.aten._weight_int4pack_mm(
                x.bfloat16(), self.packed, self.group_size, self.scales_and_zeros_bf16
            ).to(x.dtype)
        return out if self.bias is None else out + self.bias.to(x.dtype)

    def _dequantized(self) -> Tensor:
        codes = self.codes if self.codes is not None else unpack_int4_cpu(self.packed)
        return dequantize_int4(codes, self.scales_and_zeros, self.group_size)


def _pack_int4(q: Tensor) -> Tensor:
    if q.is_cpu:
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, _INT4_INNER_K_TILES)
    nibbles = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
    return torch.ops.aten._convert_weight_to_int4pack(nibbles, cuda_inner_k_tiles(q.shape[1]))


def cuda_inner_k_tiles(in_features: int) -> int:
    """The CUDA int4pack layout tiles the input in 8, 4 or 2 tiles of 16: the largest that divides it."""
    for tiles in (8, 4, 2):
        if in_features % (tiles * _INT4_K_TILE) == 0:
            return tiles
    raise ValueError(f"int4 on CUDA needs in_features divisible by 32, got {in_features}")


def unpack_int4_cpu(packed: Tensor) -> Tensor:
    """Codes [N, K] from the CPU int4pack layout: blocks of 32 rows; byte j of a column holds rows j, j + 16."""
    out_features, in_features = packed.shape[0], packed.shape[1] * 2
    blocks = packed.view(out_features // _INT4_BLOCK_ROWS, in_features, _INT4_BLOCK_ROWS // 2)
    codes = torch.cat([blocks & 15, blocks >> 4], dim=-1)
    return codes.transpose(1, 2).reshape(out_features, in_features)


def _unpacks_to(packed: Tensor, q: Tensor) -> bool:
    if packed.shape != (q.shape[0], q.shape[1] // 2) or q.shape[0] % _INT4_BLOCK_ROWS:
        return False
    return torch.equal(unpack_int4_cpu(packed).to(torch.int32), q)


def make_linear(weight: Tensor, bias: Tensor | None, dtype: str, group_size: int) -> nn.Module:
    """Build the layer for `dtype` from a float32 weight already on its target device."""
    if dtype == "int8":
        return Int8Linear(weight, bias)
    if dtype == "int4":
        return Int4Linear(weight, bias, group_size)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    return DenseLinear(weight.to(torch_dtype), bias)
