"""The skinny bf16 matmul (backends/local_engine/kernels/triton/skinny.py) against fp32/fp64 references.

On CPU the kernel runs in Triton's interpreter (tests/triton_interpreter_support.kernel_module), whose
fp32 -> bf16 cast truncates: an output element may then be one bf16 step (2^-7 relative) off the exact
product, where the GPU's rounding is within half a step. Shapes are small and not multiples of the blocks
(rows, weight rows and K), outputs start as NaN so every element the kernel should write is checked, and
split-K configs check that the ordered combine gives the same bits on every run.
"""

from tests.triton_interpreter_support import DEVICE, kernel_module  # first: skips the module without triton

# isort: split

import pytest
import torch

skinny = kernel_module("backends.local_engine.kernels.triton.skinny")
Config = skinny.SkinnyConfig

CASES = [  # rows, weight rows N, K, config (None: the interpreter's default on CPU, the table's on CUDA)
    (2, 48, 64, None),
    (5, 40, 96, Config(16, 32, 1, 1)),
    (8, 33, 80, Config(16, 32, 1, 1, block_m=8)),
    (13, 70, 160, Config(32, 64, 2, 2)),
    (24, 70, 160, Config(32, 64, 2, 2, block_m=32, pdl=True)),  # PDL: on a GPU only (griddepcontrol)
    (20, 33, 80, Config(16, 32, 1, 1)),
    (32, 64, 128, Config(16, 32, 1, 1, split=2)),
    (3, 50, 200, Config(16, 32, 1, 1, split=3)),
    (17, 64, 128, Config(32, 64, 1, 1, split=2, block_m=32)),
    (64, 24, 48, Config(16, 16, 1, 1)),
    (1, 40, 64, Config(16, 32, 1, 1)),
]


def _operands(rows: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator).bfloat16().to(DEVICE)
    weight = (torch.randn(n, k, generator=generator) * 0.05).bfloat16().to(DEVICE)
    return x, weight


@pytest.mark.parametrize(("rows", "n", "k", "config"), CASES)
def test_skinny_matmul_matches_linear_within_bf16_rounding(rows: int, n: int, k: int, config) -> None:
    x, weight = _operands(rows, n, k, rows * 1000 + n + k)
    out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    skinny.skinny_matmul(x, weight, config, out=out)
    exact = x.double() @ weight.double().T
    err = (out.double() - exact).abs()
    assert not out.isnan().any()
    assert bool((err <= exact.abs() * 2.0**-7 + 1e-6).all()), float((err / exact.abs()).max())
    assert float(err.norm() / exact.norm()) < 4e-3  # bf16 output rounding; F.linear's own is ~1.6e-3
    linear = torch.nn.functional.linear(x.float(), weight.float()).double()
    assert float((out.double() - linear).norm() / linear.norm()) < 4e-3


@pytest.mark.parametrize(
    ("rows", "n", "k", "config"), [c for c in CASES if c[3] is not None and c[3].split > 1]
)
def test_split_k_is_deterministic(rows: int, n: int, k: int, config) -> None:
    x, weight = _operands(rows, n, k, 7)
    first = skinny.skinny_matmul(x, weight, config)
    for _ in range(2):
        assert torch.equal(skinny.skinny_matmul(x, weight, config), first)


def test_dense_linear_routes_2_to_64_rows_to_the_skinny_kernel(monkeypatch) -> None:
    """DenseLinear takes the skinny kernel for 2..skinny_rows rows when the table has a config for the
    shape, and F.linear where the table says cuBLAS (None) or beyond skinny_rows."""
    from backends.local_engine.kernels.quant import DenseLinear

    x, weight = _operands(6, 40, 96, 3)
    layer = DenseLinear(weight, None)
    layer.skinny_rows = 64
    calls: list[int] = []
    real = skinny.skinny_matmul

    def counting(x: torch.Tensor, weight: torch.Tensor, config=None, out=None) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(x, weight, Config(16, 32, 1, 1) if DEVICE == "cpu" else config, out)

    monkeypatch.setattr(skinny, "skinny_matmul", counting)
    monkeypatch.setattr(skinny, "_TABLE", {(8, 40, 96): Config(16, 32, 1, 1), (16, 40, 96): None})
    out = layer(x)
    assert calls == [6]
    exact = x.double() @ weight.double().T
    assert float((out.double() - exact).norm() / exact.norm()) < 4e-3
    layer(torch.cat([x, x]))  # 12 rows: the table says cuBLAS
    layer.skinny_rows = 4
    layer(x)  # 6 rows > skinny_rows
    assert calls == [6]
