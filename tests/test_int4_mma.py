"""The tensor-core int4 layer (int4_mma.py): its packing on the CPU, its kernel on CUDA.

The CPU tests rebuild the weight from the packed words the way the kernel reads them (each lane's
mma.m16n8k16 A fragment, as PTX defines it), independently of `pack_codes`' own formula. The CUDA tests
(run on the GPU machine: `python3 -m pytest --noconftest -o addopts="" tests/test_int4_mma.py`) compare
the kernel with the float64 product of the dequantized weight, for row counts on both sides of each
8-row MMA chunk and of the 64-row weight pass.
"""

import pytest
import torch

from backends.local_engine.kernels.cuda.int4_mma import pack_codes, pack_scales, supports, unpack
from backends.local_engine.kernels.quantize import quantize_int4


def input_of(step: int, j: int, t: int, column: int) -> int:
    """The input k that MMA column `column` (0..15) of k16-tile j of a step is, for lane column t = lane % 4;
    the kernel loads a lane's B operands (MMA rows 2t, 2t + 1 | 2t + 8, 2t + 9 of each tile j) from inputs
    64 step + 16 t + 4 j + (0, 1 | 2, 3)."""
    assert column // 2 % 4 == t  # the MMA columns a lane holds
    return 64 * step + 16 * t + 4 * j + 2 * (column // 8) + column % 2


def weight_from_fragments(codes: torch.Tensor) -> torch.Tensor:
    """Codes [N, K] as the kernel sees them: lane (g, t), word j of step S, nibble pair p = a_p of the
    A fragment: a0 (row g, cols 2t..2t+1), a1 (row g + 8, same cols), a2 (row g, cols 2t + 8..), a3 (row
    g + 8, cols 2t + 8..); the even column in bits 4p.., the odd one in bits 16 + 4p.."""
    tiles, steps = codes.shape[:2]
    words = codes.to(torch.int64) & 0xFFFFFFFF
    out = torch.full((tiles * 16, steps * 64), -1, dtype=torch.int64)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for j in range(4):
            word = words[:, :, lane, j]  # [T, S]
            for p, (row, col) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
                for e in (0, 1):
                    value = (word >> (4 * p + 16 * e)) & 0xF
                    rows = torch.arange(tiles) * 16 + row
                    ks = torch.tensor([input_of(step, j, t, col + e) for step in range(steps)])
                    out[rows[:, None], ks[None, :]] = value
    return out


def test_codes_sit_where_the_mma_fragments_read_them() -> None:
    torch.manual_seed(0)
    q = torch.randint(0, 16, (48, 192), dtype=torch.int32)
    codes = pack_codes(q)
    assert codes.shape == (3, 3, 32, 4) and codes.dtype == torch.int32
    rebuilt = weight_from_fragments(codes)
    assert (rebuilt >= 0).all()  # every code placed exactly once
    assert torch.equal(rebuilt, q.to(torch.int64))


def test_packing_round_trips_codes_scales_and_zeros() -> None:
    torch.manual_seed(1)
    weight = torch.randn(32, 128)
    q, scales_and_zeros = quantize_int4(weight, 32)
    scale, zero = scales_and_zeros.unbind(-1)
    codes, packed = pack_codes(q), pack_scales(scale.t(), zero.t())
    q2, scale2, zero2 = unpack(codes, packed)
    assert torch.equal(q2, q)
    assert torch.equal(scale2, scale.t().bfloat16()) and torch.equal(zero2, zero.t().bfloat16())


def test_launch_shape_follows_the_weight_width(monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.local_engine.kernels.cuda.int4_mma import config_for

    assert config_for(4096, 14336) == 3 and config_for(28672, 4096) == 0
    overrides = "4096x14336:2,16x64:1"  # the engine setting int4_mma_configs
    assert config_for(4096, 14336, overrides) == 2 and config_for(4096, 4096, overrides) == 3


def test_supports_only_the_kernels_shapes() -> None:
    assert supports(4096, 4096, 32) and supports(896, 896, 32)
    assert not supports(4096, 4096, 64) and not supports(4104, 4096, 32) and not supports(4096, 4000, 32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel runs on CUDA")
@pytest.mark.parametrize("rows, config", [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (3, 0), (8, 2), (9, 0),
                                          (33, 0), (64, 0), (100, 0)])  # fmt: skip
def test_kernel_matches_the_dequantized_weight(
    rows: int, config: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backends.local_engine.kernels.cuda.int4_mma import Int4MmaLinear

    torch.manual_seed(rows)
    n, k = 272, 1472  # 17 tiles, 23 steps: uneven over the 8 warps of a block
    weight = torch.randn(n, k, device="cuda") * 0.05
    bias = torch.randn(n, device="cuda")
    layer = Int4MmaLinear(weight, bias, 32, configs=f"{n}x{k}:{config}")
    assert layer.config == config
    q, scale, zero = unpack(layer.codes.cpu(), layer.scales.cpu())  # the layer's own bf16 scales and zeros
    groups = (q.double().view(n, k // 32, 32) - 8) * scale.double()[..., None] + zero.double()[..., None]
    dense = groups.view(n, k).cuda()
    x = torch.randn(rows, k, device="cuda").bfloat16()
    exact = x.double() @ dense.t() + bias.double()
    out = torch.full((rows, n), float("nan"), device="cuda")
    out.copy_(layer(x.float()))
    assert not out.isnan().any()
    err = float((out.double() - exact).norm() / exact.norm())
    assert err < 3e-3, err  # bf16 weights (rounded once) and the bf16 output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel runs on CUDA")
def test_make_linear_picks_the_mma_kernel_from_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.local_engine.config import KernelSettings
    from backends.local_engine.kernels.cuda.int4_mma import Int4MmaLinear
    from backends.local_engine.kernels.quant import Int4Linear
    from backends.local_engine.kernels.select import make_linear

    kernels = KernelSettings(int4_cuda_kernel="mma")
    assert isinstance(
        make_linear(torch.randn(256, 256, device="cuda"), None, "int4", 32, kernels=kernels), Int4MmaLinear
    )
    assert isinstance(
        make_linear(torch.randn(200, 256, device="cuda"), None, "int4", 32, kernels=kernels), Int4Linear
    )
