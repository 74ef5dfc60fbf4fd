"""Linear layers for each weight format: fp32/bf16 dense, int8 and int4 weight-only quantized.

int8: symmetric, one scale per output channel. int4: asymmetric, one (scale, zero) per group of
`group_size` input channels. No layer converts its weight per call at any batch size.

CPU kernels, chosen by studies/engine_matmul.py (SmolLM2-135M shapes, 1-32 rows, AVX2 EPYC): fbgemm's int8
GEMM (`quantized.linear_dynamic`) is the fastest at every row count and its cost per row falls as rows are
added. int4 runs kernels/cpu/ops.py's int4 x int8 AVX2 kernel (2.5-4.8x torch's packed kernel at 1-32 rows on an
AVX2 EPYC), else the packed `_weight_int4pack_mm_for_cpu` (bf16 activations; int4_cpu_kernel="torch").
fbgemm quantizes the activations of a whole call with one (scale, zero point); `Int8Linear` first maps
every row affinely onto exactly [-1, 1] (x = s * x' + c) and adds `c * W·1` back, so each row is quantized
on its own range: quality stays per-row and a row's result does not depend on the rows batched with it
(integer accumulation is exact), which keeps speculative verification identical to one-token decode.
CUDA (bf16 activations): int8 runs kernels/triton's linear by default, or our own kernels (triton/quant_own.py
/ triton/gemv.py, fused into the batch-1 layer); int4 our tensor-core kernel (cuda/int4_mma.py), else torch's
packed `_weight_int4pack_mm` (tinygemm). select.py picks by the engine's KernelSettings (config.py says
which won where, measured on the H200). The quantization math is quantize.py's.
"""

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backends.local_engine.kernels.quantize import quantize_int4, quantize_int8

_INT4_INNER_K_TILES = 8
_INT4_K_TILE = 16


class DenseLinear(nn.Module):
    """F.linear; on CUDA in bf16 one-row inputs (batch-1 decode) use the Triton GEMV (kernels/triton/gemv.py),
    which reads narrow weights faster than cuBLAS (`gemv` False turns it off), and inputs of 2 up to
    `skinny_rows` rows (1 turns it off) the skinny Triton matmul (triton/skinny.py) for the weight shapes
    where it measured faster than cuBLAS (`skinny.config_for`; 8B prefill graph of a prefix-cached request
    5.15 -> 4.86 ms on the H200, studies/README.md)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, gemv: bool = True, skinny_rows: int = 64) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.to(weight.dtype), requires_grad=False)
        self.gemv = gemv and weight.is_cuda and weight.dtype == torch.bfloat16
        self.skinny_rows = skinny_rows if self.gemv else 1

    def forward(self, x: Tensor) -> Tensor:
        if self.gemv and x.shape[0] == 1:
            from backends.local_engine.kernels.triton.gemv import gemv

            out = gemv(x, self.weight)
            return out if self.bias is None else out + self.bias
        if 1 < x.shape[0] <= self.skinny_rows:
            from backends.local_engine.kernels.triton.skinny import config_for, skinny_matmul

            config = config_for(x.shape[0], *self.weight.shape)
            if config is not None:
                out = skinny_matmul(x, self.weight, config)
                return out if self.bias is None else out + self.bias
        return F.linear(x, self.weight, self.bias)

    def gemv_operands(self) -> tuple[Tensor, Tensor | None, Tensor | None] | None:
        """(weight, scale, bias) for gemv_triton's fused batch-1 kernel, or None when it does not apply."""
        return (self.weight, None, self.bias) if self.gemv else None


class ConcatLinear(nn.Module):
    """Several dense projections of one input, run as separate matmuls, outputs concatenated.

    fp32 on CUDA keeps q/k/v and gate/up apart in the checkpoint's own shapes: cuBLAS picks its kernel, and
    so its summation order, by shape, and HF's shapes give HF's sums. On the H200 this brought the 8B fp32
    logits from 1.22e-4 to 0.90e-4 of HF's (studies/results/engine_gpu_fp32.json); fp32 is the reference
    format, so its speed matters less than reproducing the reference.
    """

    def __init__(self, parts: list[Tensor], biases: list[Tensor] | None) -> None:
        super().__init__()
        self.parts = nn.ModuleList(
            DenseLinear(w, None if biases is None else b) for w, b in zip(parts, biases or parts, strict=True)
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([part(x) for part in self.parts], -1)


def fbgemm_pack_int8(q: Tensor, scale: Tensor) -> torch.ScriptObject:
    """fbgemm's prepacked per-channel int8 weight (no bias) for `quantized.linear_dynamic`."""
    zero_points = torch.zeros_like(scale, dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated as a user API; the kernels are not
        warnings.simplefilter("ignore")
        qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), zero_points, 0)
        return torch.ops.quantized.linear_prepack(qweight, None)


# fbgemm's activation quantization of a tensor whose range is exactly [-1, 1] (7-bit with reduce_range,
# as AVX2's 8-bit multiply-add would saturate): scale 2/127, zero point 64, codes 0..128.
_ACT_SCALE = torch.tensor(2.0 / 127.0, dtype=torch.float32)
_ACT_INV_SCALE = float(1.0 / _ACT_SCALE)
_ACT_SCALE_F = float(_ACT_SCALE)


def rowwise_int8_linear(x: Tensor, packed: torch.ScriptObject, row_sums: Tensor) -> Tensor:
    """x @ W.T through fbgemm with every row of x quantized on its own range to ~14 bits.

    Each row is mapped onto [-1, 1]. fbgemm's 7-bit codes of that alone cost 12 % perplexity on SmolLM2,
    so the rounding residual (scaled up by 2/step) goes through the same call as extra rows, plus one row
    holding exactly 1 and -1: one GEMM whose activation range is [-1, 1] whatever the batch holds, so a
    row's result never depends on the rows batched with it (integer accumulation is exact).
    """
    rows = x.shape[0]
    low, high = torch.aminmax(x, dim=-1, keepdim=True)
    center = (high + low) * 0.5
    half_range = ((high - low) * 0.5).clamp_(min=1e-20)
    scaled = ((x - center) / half_range).clamp_(-1.0, 1.0).mul_(_ACT_INV_SCALE)
    residual = (scaled - torch.round(scaled)).mul_(2.0)  # in [-1, 1]
    stacked = torch.cat([scaled.mul_(_ACT_SCALE_F), residual, _pin_row(x.shape[1])])
    out = torch.ops.quantized.linear_dynamic(stacked, packed, True)
    out = out[:rows].add_(out[rows : 2 * rows], alpha=_ACT_SCALE_F / 2.0)
    return out.mul_(half_range).addcmul_(center, row_sums)


_PIN_ROWS: dict[int, Tensor] = {}


def _pin_row(width: int) -> Tensor:
    """[1, width] row holding 1 and -1: fixes fbgemm's per-call activation range to exactly [-1, 1]."""
    if width not in _PIN_ROWS:
        row = torch.zeros(1, width)
        row[0, 0], row[0, 1] = 1.0, -1.0
        _PIN_ROWS[width] = row
    return _PIN_ROWS[width]


class Int8Linear(nn.Module):
    """CPU: fbgemm int8 GEMM on the prepacked weight (any number of rows); CUDA: the int8 Triton kernel."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        q, scale = quantize_int8(weight.float())
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        self.register_buffer("scale", scale)
        self.packed: torch.ScriptObject | None = None
        if q.is_cpu:
            self.register_buffer("row_sums", (q.float() * scale[:, None]).sum(dim=1))
            self.packed = fbgemm_pack_int8(q, scale)
            self.register_buffer("q", None)
            self.packed_nbytes = q.numel()
        else:
            self.register_buffer("q", q)
            self.packed_nbytes = 0

    def forward(self, x: Tensor) -> Tensor:
        if self.packed is not None:
            out = rowwise_int8_linear(x.float(), self.packed, self.row_sums).to(x.dtype)
        else:
            from backends.local_engine.kernels.triton.quant_own import int8_matmul

            out = int8_matmul(x, self.q, self.scale)
        return out if self.bias is None else out + self.bias.to(x.dtype)

    def gemv_operands(self) -> tuple[Tensor, Tensor | None, Tensor | None] | None:
        """(int8 weight, scale, bias) for gemv_triton's fused batch-1 kernel (CUDA only), else None."""
        return None if self.q is None or not self.q.is_cuda else (self.q, self.scale, self.bias)


class Fp16Linear(nn.Module):
    """fbgemm's fp16-weight GEMM (`quantized.linear_dynamic_fp16`): fp32 activations, weights stored in fp16
    and widened inside the kernel, so rows are computed exactly as in fp32 up to the weights' rounding. CPU only.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        if not weight.is_cpu:
            raise ValueError("the fp16 format is fbgemm's CPU kernel; use bf16 on CUDA")
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # fp16 rounding of tiny weights warns ("saturation") once per layer
            self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        self.packed_nbytes = weight.numel() * 2

    def forward(self, x: Tensor) -> Tensor:
        out = torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
        return out if self.bias is None else out + self.bias


class Int4Linear(nn.Module):
    """The packed int4 kernel at every row count (CPU: `_weight_int4pack_mm_for_cpu`, bf16 activations).

    CUDA: torch's `_weight_int4pack_mm` (tinygemm), or with `triton` (int4_cuda_kernel="triton") the kernels of
    kernels/triton/quant_own.py / kernels/triton/gemv.py on nibble-packed bytes with bf16 (scale, min) per group; at batch 1 these
    run inside the fused decode layer (model.py `gemv_forward`).
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, group_size: int, triton: bool = False) -> None:
        super().__init__()
        q, scales_and_zeros = quantize_int4(weight.float(), group_size)
        self.group_size = group_size
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        self.triton = triton and weight.is_cuda
        if self.triton:
            from backends.local_engine.kernels.triton.quant_own import pack_int4

            scale, zero = scales_and_zeros.unbind(-1)  # [K / group, N] each; zero is min + 8 * scale
            self.register_buffer("packed", pack_int4(q))
            self.register_buffer("scales_mins", torch.stack([scale.t(), (zero - 8.0 * scale).t()]).bfloat16())
            return
        self.register_buffer("packed", _pack_int4(q))
        self.register_buffer("scales_and_zeros_bf16", scales_and_zeros.bfloat16())

    def forward(self, x: Tensor) -> Tensor:
        if self.triton:
            from backends.local_engine.kernels.triton.quant_own import int4_matmul

            out = int4_matmul(x, self.packed, self.scales_mins, self.group_size)
            return out if self.bias is None else out + self.bias.to(x.dtype)
        kernel = (
            torch.ops.aten._weight_int4pack_mm_for_cpu
            if self.packed.is_cpu
            else torch.ops.aten._weight_int4pack_mm
        )
        out = kernel(x.bfloat16(), self.packed, self.group_size, self.scales_and_zeros_bf16).to(x.dtype)
        return out if self.bias is None else out + self.bias.to(x.dtype)

    def gemv_operands(self) -> tuple[Tensor, Tensor | None, Tensor | None] | None:
        """(packed int4 weight, [scales; mins], bias) for gemv_triton's fused batch-1 kernel (Triton layout)."""
        return (self.packed, self.scales_mins, self.bias) if self.triton else None


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
