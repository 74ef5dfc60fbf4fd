"""int4 weight-only linear layers on tensor cores for CUDA decode (the engine setting int4_cuda_kernel="mma").

Why hand-written (issue 17): at 8B batch 1 torch's tinygemm (`_weight_int4pack_mm`) reads the int4
projections at ~1.7 TB/s of the H200's 4.2, and GemLite's Triton GEMV measured the same (80.9 against
81.9 µs a layer, studies/results/engine_gpu_int4_gemlite.json); a Triton GEMV of our own reached ~1 TB/s
(studies/engine_gpu_int4_gemv.py). This kernel (int4_mma.cu, compiled on first use through
torch.utils.cpp_extension) stores the codes in the register order of the tensor cores' A operand, so a
thread turns one 32-bit word into its whole 16 x 16 fragment with four shift + and-or pairs (two codes
each, as bf16x2 via the 0x4300 exponent trick) and two bf16x2 FMAs per pair; the activation rows are the
MMA's narrow side (8 per instruction). Dequantization as tinygemm's (`quant.Int4Linear`): (q - 8) * scale
+ zero per group of 32 inputs with bf16 scale and zero, the weight rounded to bf16 once, fp32 accumulation.

Layout (`pack_codes`, `pack_scales`): weight row r = 16 T + 8 h + g, input k = 64 S + 16 t + 4 j + 2 kh + e
(T tile, S step, j k16-tile of the step, g = lane // 4, t = lane % 4; MMA column 8 kh + 2 t + e of tile j).
Word [T, S, lane, j] holds the codes of (h, kh, e) at bit 4 (h + 2 kh) + 16 e. A lane's inputs of a step
are 16 consecutive ones (its B operands: two 16-byte loads) in one group of 32. Scales: [T, group, 16 rows] int32 = bf16 scale | bf16 zero << 16.

Fused forms for the decode layer (`Int4MmaLinear.fused`, used by model.py's `int4_forward`): RMSNorm of the
input inside the kernel, a residual added in its epilogue, and SwiGLU for the gate/up weight, whose rows are
stored interleaved per 16-row tile (`interleave_gate_up`) so that one block holds a gate row and its up row.
Correct on the H200 but slower (2026-12-05, studies/README.md "Eleventh session"): the 8B int4 batch-1 graph
takes 2.66 ms with them against 2.45 without, as the norm work in every lane's main loop costs the GEMV more than
the norm launches it saves; so model/llama.py takes them only with int4_fused=True. int4_pdl=True launches the
kernel with programmatic dependent launch (sm_90+): each block prefetches its first steps of codes into L2,
lets the next kernel start, then waits for the previous one before reading x. Slower still (2.69 ms with the
fused layer), so off too.

Launch shapes for one to eight rows (warps per block, loads in flight per thread): `config_for`, from H200
measurements (studies/engine_gpu_int4_kernels.py --configs). Measured there at 8B (per layer, four
projections): 56.3 µs at 1 row and 57.5 at 8 against tinygemm's 83.5 and 168.5; batch-1 decode 408 tok/s
(46.9 % of the int4 roofline) against 301 (studies/results/engine_gpu_int4_mma_decode.json).
"""

import functools
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from backends.local_engine.kernels.quantize import quantize_int4

GROUP = 32
STORE_PLAIN, STORE_GATE_UP, STORE_SWIGLU = 0, 1, 2  # int4_mma.cu's output modes
_SHIFTS = torch.tensor([[[4 * (h + 2 * kh) + 16 * e for e in (0, 1)] for kh in (0, 1)] for h in (0, 1)])


def supports(out_features: int, in_features: int, group_size: int) -> bool:
    return group_size == GROUP and out_features % 16 == 0 and in_features % 64 == 0


def pack_codes(q: Tensor) -> Tensor:
    """Codes [N, K] in 0..15 → int32 words [N/16, K/64, 32, 4] in the MMA fragment order above."""
    n, k = q.shape
    view = q.to(torch.int64).view(n // 16, 2, 8, k // 64, 4, 4, 2, 2)  # T h g S t j kh e
    view = view.permute(0, 3, 2, 4, 5, 1, 6, 7)  # T S g t j h kh e
    words = (view << _SHIFTS.to(q.device)).sum(dim=(-3, -2, -1))  # disjoint bits: the sum is an or
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).reshape(n // 16, k // 64, 32, 4).contiguous()


def interleave_gate_up(weight: Tensor) -> Tensor:
    """[gate; up] rows [2I, K] → tile T's rows 0-7 = gate rows 8T.., rows 8-15 = up rows 8T.. (I % 8 == 0).
    The kernel stores row r of tile T at output 8T + r (r < 8) or I + 8T + r - 8: the original order."""
    n, k = weight.shape
    return weight.view(2, n // 16, 8, k).transpose(0, 1).reshape(n, k)


def pack_scales(scale: Tensor, zero: Tensor) -> Tensor:
    """bf16 scale and zero [N, K/32] → int32 [N/16, K/32, 16]: scale in the low half, zero in the high."""
    n, groups = scale.shape
    bits = scale.bfloat16().view(torch.int16).to(torch.int32) & 0xFFFF
    bits = bits | (zero.bfloat16().view(torch.int16).to(torch.int32) << 16)
    return bits.view(n // 16, 16, groups).transpose(1, 2).contiguous()


def unpack(codes: Tensor, scales: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of the two packings: (q [N, K], scale [N, K/32] bf16, zero [N, K/32] bf16); for tests."""
    tiles, steps = codes.shape[:2]
    words = codes.to(torch.int64) & 0xFFFFFFFF
    nibbles = (words[..., None, None, None] >> _SHIFTS.to(codes.device)) & 0xF  # T S lane j h kh e
    nibbles = nibbles.view(tiles, steps, 8, 4, 4, 2, 2, 2)  # T S g t j h kh e
    q = nibbles.permute(0, 5, 2, 1, 3, 4, 6, 7).reshape(tiles * 16, steps * 64)  # T h g S t j kh e
    bits = scales.transpose(1, 2).reshape(tiles * 16, -1)
    scale = (bits & 0xFFFF).to(torch.int16).view(torch.bfloat16)
    zero = ((bits >> 16) & 0xFFFF).to(torch.int16).view(torch.bfloat16)
    return q.to(torch.int32), scale, zero


@functools.cache
def _extension():  # noqa: ANN202
    from torch.utils.cpp_extension import load_inline

    major, minor = torch.cuda.get_device_capability()  # this card's architecture only (torch then adds none)
    source = (Path(__file__).with_name("int4_mma.cu")).read_text()
    return load_inline(
        name="llmgw_int4_mma",
        cpp_sources="torch::Tensor int4_mma_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, "
        "int64_t n, int64_t config, std::optional<torch::Tensor> norm, std::optional<torch::Tensor> residual, "
        "double eps, int64_t mode, bool pdl);",
        cuda_sources=source,
        functions=["int4_mma_matmul"],
        extra_cuda_cflags=["-O3", f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"],
    )


def int4_mma_matmul(
    x: Tensor, codes: Tensor, scales: Tensor, out_features: int, config: int = 0, *, norm: Tensor | None = None,
    residual: Tensor | None = None, eps: float = 0.0, mode: int = STORE_PLAIN, pdl: bool = False,
) -> Tensor:  # fmt: skip
    """x [M, K] bf16 → [M, N] bf16 (any M; 64 rows per weight pass). `config` 0-4: the launch shape of
    one-to-eight-row calls, (warps, loads in flight) = (8, 4), (16, 4), (8, 8), (16, 2), (4, 8).
    `norm` [K] bf16: multiply by RMSNorm(x) * norm instead of x; `residual` [M, N] bf16: added to the rounded
    product; `mode` STORE_GATE_UP / STORE_SWIGLU for interleaved gate/up rows: [gate | up], or silu(gate) * up
    [M, N / 2]. `pdl` (sm_90+ only: the caller checks, as select.make_linear does): programmatic dependent launch, the first weight loads issued
    before the wait for the previous kernel in the stream (or graph) to finish."""
    return _extension().int4_mma_matmul(
        x.contiguous(), codes, scales, out_features, config, norm, residual, eps, mode, pdl
    )


CONFIGS = range(5)


def config_for(out_features: int, in_features: int, overrides: str = "") -> int:
    """Launch shape for 1-8 rows. Measured on the H200 over the Llama-3 8B shapes
    (studies/results/engine_gpu_int4_kernels.json): weights of <= 4096 rows (o, down) run best with 16 warps
    sharing K, two loads in flight each (config 3: o 5.95 µs against 6.71, down 15.1 against 16.5), wider
    ones (qkv, gate_up) with 8 warps and four loads (config 0). `overrides` "NxK:c,..." (the engine setting
    int4_mma_configs) wins."""
    for item in filter(None, overrides.split(",")):
        shape, config = item.split(":")
        if shape == f"{out_features}x{in_features}":
            return int(config)
    return 3 if out_features <= 4096 else 0


@functools.cache
def available() -> bool:
    """Whether the kernel builds here (a CUDA toolkit with nvcc is needed on first use); says why if not."""
    try:
        _extension()
    except Exception as error:  # noqa: BLE001 - any build failure means: use tinygemm
        warnings.warn(f"int4_mma kernel unavailable, int4 falls back to tinygemm: {error}", stacklevel=2)
        return False
    return True


class Int4MmaLinear(nn.Module):
    """Drop-in for quant.Int4Linear on CUDA when `supports` the shape; holds only the packed int4 bytes."""

    def __init__(
        self, weight: Tensor, bias: Tensor | None, group_size: int, gate_up: bool = False, pdl: bool = False,
        configs: str = "",
    ) -> None:  # fmt: skip
        """`gate_up`: `weight` is [gate; up]; its rows are stored interleaved (`interleave_gate_up`), the
        output keeps the original order, and `fused(..., swiglu=True)` can apply SwiGLU in the kernel.
        `pdl` (sm_90+ only: the caller checks): programmatic dependent launch. `configs`: `config_for`'s
        overrides."""
        super().__init__()
        out_features, in_features = weight.shape
        if not supports(out_features, in_features, group_size):
            raise ValueError(
                f"int4_mma needs group 32, N % 16 == 0, K % 64 == 0; got {weight.shape}, {group_size}"
            )
        if gate_up and bias is not None:
            raise ValueError("int4_mma's gate/up layout takes no bias")
        self.mode = STORE_GATE_UP if gate_up else STORE_PLAIN
        self.pdl = pdl and weight.is_cuda
        if gate_up:
            weight = interleave_gate_up(weight)
        q, scales_and_zeros = quantize_int4(weight.float(), group_size)
        scale, zero = scales_and_zeros.unbind(-1)  # [K / group, N]; zero is min + 8 * scale
        self.out_features = out_features
        self.config = config_for(out_features, in_features, configs)
        self.register_buffer("codes", pack_codes(q))
        self.register_buffer("scales", pack_scales(scale.t(), zero.t()))
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).bfloat16()
        out = int4_mma_matmul(
            x2, self.codes, self.scales, self.out_features, self.config, mode=self.mode, pdl=self.pdl
        )
        out = out.to(x.dtype).reshape(*shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias.to(x.dtype)

    def fused(
        self, x: Tensor, norm: Tensor | None = None, eps: float = 0.0, residual: Tensor | None = None,
        swiglu: bool = False,
    ) -> Tensor:  # fmt: skip
        """bf16 x [M, K] → W (RMSNorm(x) * norm) (norm given) + residual (given); with `swiglu` (a gate_up
        layer) silu(gate) * up [M, N / 2]. No bias (model.py's `int4_forward` takes only bias-free layers)."""
        if swiglu and self.mode != STORE_GATE_UP:
            raise ValueError("swiglu needs a layer built with gate_up=True")
        mode = STORE_SWIGLU if swiglu else self.mode
        return int4_mma_matmul(
            x, self.codes, self.scales, self.out_features, self.config, norm=norm, residual=residual, eps=eps,
            mode=mode, pdl=self.pdl,
        )  # fmt: skip
