"""Quantized linear layers on x86-64 CPUs with AVX2: int4 or int8 codes x int8-quantized activations (issue 14).

Why hand-written: on AVX2 CPUs (no AVX-512) torch's `_weight_int4pack_mm_for_cpu` reads the SmolLM2 weights
at 1.3-4.8 GB/s (studies/README.md, "int4 on AVX2 CPUs"), which made int4 batch-1 decode 27 tok/s on a 2-core
EPYC. llama.cpp's Q4 x Q8 integer dot products are the known-good method; int4_cpu.cpp does the same on the
engine's own int4 format: each activation row is quantized per group of 32 to int8 with its own scale
(llama.cpp's Q8_0), and `vpmaddubsw` + `vpmaddwd` take the integer dot of 32 codes at once. It is compiled on
first use by torch.utils.cpp_extension (the system C++ compiler and ninja; about 30 s, then cached).

Weights keep the engine's int4 values: codes 0..15 and bf16 (scale, zero) per group of 32 inputs,
w = (q - 8) * scale + zero, rearranged in tiles of 8 rows (`pack`). A row's result depends only on that row
(its own activation scales, a fixed summation order), so batching, chunked prefill and speculative verification
give the same logits as one-token decode.

The int4 format's output layer stays int8 (an int4 one costs +5.5 % perplexity on the engine's quality text,
against +0.26 % with int8): int8_cpu.cpp, the same method with llama.cpp's Q8_0 x Q8_0 sign trick, one scale
per weight row (`Int8CpuLinear`; 0.8-1.2 ms against fbgemm's 3.4 at 1 row, ~7 against 17.7 at 16 rows).

Which kernel a CPU int4 layer uses (the engine setting `int4_cpu_kernel`): "auto" (default) takes these kernels on every CPU
with AVX2 and FMA, with AVX-512 VNNI tiles (`vpdpbusd`, same layout, bit-identical results) where the CPU has
avx512_vnni, avx512vl and avx512bw; "avx2" keeps the AVX2 tiles, "avx512vnni" asks for VNNI, "torch" takes torch's
packed kernel (then the one-call step of model/cpu_decode.py is off too). Measured: on a 2-core AVX2 EPYC the batch-1
step took 37.5 ms with torch's kernel, 6.8 ms with these kernels and the one-call step; on a 2-core Zen 4 EPYC the
VNNI tiles take all int4 layers of a 16-row step in 10.8-12.4 ms against 14.2-15.5 with the AVX2 tiles and 25.0
with torch's kernel (studies/README.md, "On an AVX-512 host"). Where the build fails or the shape does not fit
(N % 8, K % 32, group 32), torch's kernel is used.
"""

import functools
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from backends.local_engine.kernels.quantize import quantize_int4, quantize_int8

GROUP = 32
TILE = 8
_FLAGS = ("avx2", "fma", "f16c")
_VNNI_FLAGS = ("avx512_vnni", "avx512vl", "avx512bw")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next(
        (set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set()
    )


def choice(wanted: str = "auto") -> str:
    """ "avx512vnni", "avx2" or "torch" for CPU int4 layers on this machine, given the setting `wanted`
    (KernelSettings.int4_cpu_kernel; see the module docstring)."""
    if wanted not in ("auto", "avx512vnni", "avx2", "torch"):
        raise ValueError(f"int4_cpu_kernel must be auto, avx512vnni, avx2 or torch, not {wanted!r}")
    flags = _cpu_flags()
    if wanted == "torch" or not all(flag in flags for flag in _FLAGS):
        return "torch"
    if wanted != "avx2" and all(flag in flags for flag in _VNNI_FLAGS):
        return "avx512vnni"
    return "avx2"


_BUILD: dict[str, object] = {}  # "module" once built, or "error": the first build's failure


def _extension():  # noqa: ANN202
    """The compiled kernels. A failed build is not retried in this process: torch's JIT would then load the
    library of an earlier successful build, i.e. stale code, as if the failure had not happened."""
    if "error" in _BUILD:
        raise RuntimeError("the CPU kernels failed to build earlier in this process") from _BUILD["error"]
    if "module" not in _BUILD:
        from torch.utils.cpp_extension import load_inline

        here = Path(__file__).parent  # one unit: the others call int4_cpu.cpp's quantize_rows and matmul
        sources = [(here / name).read_text() for name in ("int4_cpu.cpp", "int8_cpu.cpp", "cpu_decode.cpp")]
        try:
            _BUILD["module"] = load_inline(
                name="llmgw_cpu_kernels",
                cpp_sources=sources,
                functions=["int4_linear_cpu", "int8_linear_cpu", "decode_layers", "set_isa"],
                extra_cflags=["-O3", "-fopenmp", "-mavx2", "-mfma", "-mf16c"],
                extra_ldflags=["-fopenmp"],
            )
        except Exception as error:
            _BUILD["error"] = error
            raise
    return _BUILD["module"]


@functools.cache
def available(wanted: str = "auto") -> bool:
    """Whether CPU int4 layers use this kernel here: chosen (`choice(wanted)`) and built."""
    isa = choice(wanted)
    if isa == "torch":
        return False
    try:
        _extension().set_isa(isa)
    except Exception as error:  # noqa: BLE001 - any build failure means: use torch's kernel
        warnings.warn(f"int4 AVX2 kernel unavailable, int4 uses torch's kernel: {error}", stacklevel=2)
        return False
    return True


def supports(out_features: int, in_features: int, group_size: int) -> bool:
    return group_size == GROUP and in_features % GROUP == 0 and out_features % TILE == 0


def pack(q: Tensor, scales_and_zeros: Tensor) -> tuple[Tensor, Tensor]:
    """Codes [N, K] in 0..15 and (scale, zero) [K/32, N, 2] → codes uint8 [N/8, K/32, 4, 32] and bf16
    scales [N/8, K/32, 2, 8] in the layout of int4_cpu.cpp."""
    n, k = q.shape
    view = q.to(torch.uint8).view(n // TILE, TILE, k // GROUP, 4, 2, 4)  # t r g p h c
    view = view.permute(0, 2, 3, 4, 1, 5)  # t g p h r c
    codes = (view[:, :, :, 0] | view[:, :, :, 1] << 4).reshape(n // TILE, k // GROUP, 4, 32).contiguous()
    scales = scales_and_zeros.view(k // GROUP, n // TILE, TILE, 2).permute(1, 0, 3, 2)
    return codes, scales.contiguous().bfloat16()


def unpack(codes: Tensor, scales: Tensor) -> tuple[Tensor, Tensor]:
    """Inverse of `pack` (for tests): codes [N, K] and (scale, zero) [K/32, N, 2]."""
    tiles, groups = codes.shape[:2]
    q = torch.stack([codes & 0xF, codes >> 4], dim=3).view(tiles, groups, 4, 2, TILE, 4)  # t g p h r c
    q = q.permute(0, 4, 1, 2, 3, 5).reshape(tiles * TILE, groups * GROUP)
    return q, scales.permute(1, 0, 3, 2).reshape(groups, tiles * TILE, 2)


def int4_linear_cpu(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] float32 or bfloat16 → [..., N] in x's dtype."""
    return _extension().int4_linear_cpu(x, codes, scales, bias)


def decode_layers(*args: object) -> Tensor:
    """cpu_decode.cpp's whole layer stack (cpu_decode.CpuDecoder calls it)."""
    return _extension().decode_layers(*args)


class Int4CpuLinear(nn.Module):
    """Drop-in for quant.Int4Linear on a CPU where `available()`: float32 or bfloat16 in, the same out."""

    def __init__(self, weight: Tensor, bias: Tensor | None, group_size: int = GROUP) -> None:
        super().__init__()
        if not supports(*weight.shape, group_size):
            raise ValueError(f"int4_cpu needs group 32, K % 32 == 0, N % 8 == 0; got {tuple(weight.shape)}")
        q, scales_and_zeros = quantize_int4(weight.float(), group_size)
        codes, scales = pack(q, scales_and_zeros)
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return _extension().int4_linear_cpu(x, self.codes, self.scales, self.bias)


def pack_int8(q: Tensor) -> Tensor:
    """int8 codes [N, K] → [N/8, K/4, 32] in the layout of int8_cpu.cpp (8 rows x 4 inputs per 32 bytes)."""
    n, k = q.shape
    return q.view(n // TILE, TILE, k // 4, 4).transpose(1, 2).reshape(n // TILE, k // 4, 32).contiguous()


class Int8CpuLinear(nn.Module):
    """Symmetric per-row int8 weight through int8_cpu.cpp (the int4 format's output layer on AVX2 CPUs)."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        if not supports(*weight.shape, GROUP):
            raise ValueError(f"int8_cpu needs K % 32 == 0 and N % 8 == 0; got {tuple(weight.shape)}")
        q, scale = quantize_int8(weight.float())
        self.register_buffer("codes", pack_int8(q))
        self.register_buffer("scale", scale.float().contiguous())

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        out = _extension().int8_linear_cpu(x.reshape(-1, shape[-1]), self.codes, self.scale)
        return out.view(*shape[:-1], -1).to(x.dtype)
