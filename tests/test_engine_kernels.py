"""Triton kernels of the local engine (backends/local_engine/kernels/triton) against torch references.

On CPU the kernels run in Triton's interpreter (tests/triton_interpreter_support.kernel_module);
with KERNEL_TEST_DEVICE=cuda the same cases run compiled on the GPU. Inputs are random (never zeros), outputs
start as NaN so every row the kernel should write is checked, and the batches mix decodes, prefill chunks
with and without cached context, padding sequences, GQA / MQA / non-power-of-two head counts, sliding
windows, contexts ending on and around block boundaries, and split-K.
"""

from tests.triton_interpreter_support import DEVICE, kernel_module  # first: skips the module without triton

# isort: split

import pytest
import torch

from backends.local_engine.kernels.quantize import dequantize_int4, quantize_int4, quantize_int8
from backends.local_engine.kernels.triton.formats import (
    int4_rows,
    int8_rows,
    pack_int4,
    quantize_int4_packed,
    unpack_int4,
)
from backends.local_engine.kernels.triton.reference import (
    reference_int4_matmul,
    reference_int8_matmul,
    reference_paged_attention,
)
from backends.local_engine.model.attention import build_metadata
from backends.local_engine.model.attention import paged_attention as engine_attention
from backends.local_engine.model.gemma3.window import windowed

attention = kernel_module("backends.local_engine.kernels.triton.paged_attention")
kernel_module("backends.local_engine.kernels.triton.quant_kernels")  # the programs quant_matmul launches
matmul = kernel_module("backends.local_engine.kernels.triton.quant_matmul")
metadata = kernel_module("backends.local_engine.kernels.triton.metadata")
linear = kernel_module("backends.local_engine.kernels.triton.linear")

TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
BLOCK_SIZE = 4


class Batch:
    """Random q and pool, shuffled block tables; `q_lens[s]` new tokens of sequence s end its context."""

    def __init__(
        self, q_lens: list[int], context_lens: list[int], heads: int, kv_heads: int, head_dim: int,
        dtype: torch.dtype, seed: int = 0,
    ) -> None:  # fmt: skip
        generator = torch.Generator().manual_seed(seed)
        max_blocks = max(-(-c // BLOCK_SIZE) for c in context_lens) + 1  # padded tables
        num_blocks = len(q_lens) * max_blocks + 5
        order = torch.randperm(num_blocks, generator=generator)
        self.tables = order[: len(q_lens) * max_blocks].view(len(q_lens), max_blocks).int().to(DEVICE)
        self.spare_blocks = order[len(q_lens) * max_blocks :]  # owned by no sequence
        self.pool = self._randn((2, num_blocks * BLOCK_SIZE, kv_heads, head_dim), dtype, generator)
        self.q = self._randn((sum(q_lens), heads, head_dim), dtype, generator)
        starts = [0]
        for q_len in q_lens:
            starts.append(starts[-1] + q_len)
        self.query_start_loc = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
        self.context_lens = torch.tensor(context_lens, dtype=torch.int32, device=DEVICE)
        self.q_lens, self.scale = q_lens, head_dim**-0.5

    @staticmethod
    def _randn(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
        return torch.randn(shape, generator=generator).add_(0.1).to(dtype).to(DEVICE)

    def reference(self, window: int = 0) -> torch.Tensor:
        return reference_paged_attention(
            self.q, self.pool, self.tables, BLOCK_SIZE, self.context_lens, self.query_start_loc,
            self.scale, window,
        )  # fmt: skip

    def varlen(self, window: int = 0, **options: int) -> torch.Tensor:
        out = torch.full_like(self.q, float("nan"))
        attention.paged_attention(
            self.q, self.pool, self.tables, BLOCK_SIZE, self.context_lens, self.query_start_loc,
            self.scale, window, out=out, **options,
        )  # fmt: skip
        return out


def assert_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    tolerance = TOLERANCE[out.dtype]
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), expected.float(), atol=tolerance, rtol=tolerance)


MIXES = {  # name: (q_lens, context_lens)
    "decode": ([1, 1, 1, 1], [1, 4, 5, 23]),
    "prefill": ([7, 4, 13], [7, 4, 13]),
    "mixed": ([1, 6, 0, 1, 9, 3], [17, 6, 5, 8, 12, 3]),  # q_len 0 = a padding sequence
}
HEADS = {"gqa": (4, 2), "gqa3": (6, 2), "mha3": (3, 3), "mqa": (4, 1)}  # (query heads, KV heads)


@pytest.mark.parametrize(
    ("mix", "heads"),
    [("decode", "gqa3"), ("prefill", "gqa"), ("mixed", "gqa"), ("mixed", "mha3"), ("mixed", "mqa")],
)
def test_varlen_matches_reference(mix: str, heads: str) -> None:
    batch = Batch(*MIXES[mix], *HEADS[heads], head_dim=32, dtype=torch.float32)
    assert_close(batch.varlen(block_m=16, block_n=16), batch.reference())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen_half_precision_large_tiles(dtype: torch.dtype) -> None:
    batch = Batch([1, 40, 2], [70, 40, 33], 8, 2, head_dim=64, dtype=dtype, seed=1)
    assert_close(batch.varlen(), batch.reference())


@pytest.mark.parametrize("window", [1, 5])
def test_sliding_window(window: int) -> None:
    batch = Batch([1, 9, 1, 20], [30, 21, 3, 20], 4, 2, head_dim=32, dtype=torch.float32, seed=2)
    assert_close(batch.varlen(window, block_m=16, block_n=16), batch.reference(window))


@pytest.mark.parametrize(("num_splits", "window"), [(2, 0), (3, 6)])
def test_split_k(num_splits: int, window: int) -> None:
    batch = Batch([1, 5, 1, 0], [37, 29, 2, 9], 4, 2, head_dim=32, dtype=torch.bfloat16, seed=3)
    assert_close(batch.varlen(window, block_m=16, block_n=16, num_splits=num_splits), batch.reference(window))


def test_head_dim_not_power_of_two() -> None:
    batch = Batch([2, 1, 6], [9, 12, 6], 4, 2, head_dim=48, dtype=torch.float32, seed=4)
    assert_close(batch.varlen(block_m=16, block_n=16), batch.reference())


@pytest.mark.parametrize(("num_splits", "window"), [(1, 0), (3, 7)])
def test_decode_at_block_boundaries(num_splits: int, window: int) -> None:
    context_lens = [BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 12 * BLOCK_SIZE, 12 * BLOCK_SIZE + 1, 1]
    batch = Batch([1] * len(context_lens), context_lens, 8, 1, head_dim=32, dtype=torch.bfloat16, seed=5)
    out = torch.full_like(batch.q, float("nan"))
    attention.paged_decode(
        batch.q, batch.pool, batch.tables, BLOCK_SIZE, batch.context_lens, batch.scale, window,
        num_splits=num_splits, out=out, block_n=16,
    )  # fmt: skip
    assert_close(out, batch.reference(window))


def test_choose_num_splits() -> None:
    assert attention.choose_num_splits(1, 8, 4096) == 16  # batch 1: 8 programs otherwise
    assert attention.choose_num_splits(1, 8, 600) == 2  # slices of at least 256 keys
    assert attention.choose_num_splits(64, 8, 4096) == 1  # 512 programs fill 132 SMs


def test_decode_padding_sequence_writes_zeros() -> None:
    """A CUDA-graph batch padded with context_len 0 rows: those rows come out as 0, the others exact."""
    batch = Batch([1, 1, 1], [9, 1, 1], 4, 2, head_dim=32, dtype=torch.float32, seed=6)
    batch.context_lens[1] = 0
    out = attention.paged_decode(
        batch.q, batch.pool, batch.tables, BLOCK_SIZE, batch.context_lens, batch.scale
    )
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert_close(out[[0, 2]], batch.reference()[[0, 2]])


@pytest.mark.parametrize("window", [0, 5])
def test_kernel_attention_matches_engine_attention(window: int) -> None:
    """kernel_attention (metadata builder, K/V write, one launch) against attention.py's per_seq and auto
    layouts on fresh K/V (Gemma's window through gemma3.window)."""
    q_lens, context_lens = [1, 6, 1, 11], [14, 6, 3, 19]
    batch = Batch(q_lens, context_lens, 6, 2, head_dim=32, dtype=torch.float32, seed=7)
    spans = [(batch.tables[s].tolist(), context_lens[s] - q_lens[s], q_lens[s]) for s in range(len(q_lens))]
    new_kv = torch.randn(sum(q_lens), 2, 2, 32).to(DEVICE)
    kernel_pool = batch.pool.clone()
    meta = metadata.build_kernel_metadata(spans, BLOCK_SIZE, torch.device(DEVICE))
    out = metadata.kernel_attention(batch.q, new_kv, kernel_pool, meta, batch.scale, window)
    for layout in ("per_seq", "auto"):
        engine_meta = build_metadata(spans, BLOCK_SIZE, torch.device(DEVICE), layout, query_group=3)
        assert torch.equal(meta.slot_mapping, engine_meta.slot_mapping)
        engine_pool = batch.pool.clone()
        engine_meta = windowed(engine_meta, window) if window else engine_meta
        expected = engine_attention(batch.q, new_kv, engine_pool, engine_meta)
        assert torch.equal(kernel_pool, engine_pool)
        assert_close(out, expected)


def test_padded_decode_bucket() -> None:
    """A CUDA-graph bucket of 5 decode rows holding 3 sequences: padding K/V goes to the spare slot only."""
    batch = Batch([1, 1, 1], [9, 2, 16], 4, 2, head_dim=32, dtype=torch.bfloat16, seed=8)
    spans = [(batch.tables[s].tolist(), int(batch.context_lens[s]) - 1, 1) for s in range(3)]
    spare = int(batch.spare_blocks[0]) * BLOCK_SIZE
    meta = metadata.build_kernel_metadata(
        spans, BLOCK_SIZE, torch.device(DEVICE), pad_to=(5, 5), padding_slot=spare
    )
    assert meta.block_tables.shape[0] == 5 and meta.context_lens.tolist() == [9, 2, 16, 0, 0]
    q = torch.cat([batch.q, batch.q[:2] + 1.0])
    kv = batch.pool[:, meta.slot_mapping[:3]].transpose(0, 1)  # the cached K/V of the real tokens
    kv = torch.cat([kv, torch.full_like(kv[:2], 7.0)])
    pool = batch.pool.clone()
    out = metadata.kernel_attention(q, kv, pool, meta, batch.scale)
    written = (pool != batch.pool).any(dim=(0, 2, 3)).nonzero().flatten().tolist()
    assert written == [spare]
    assert_close(out[:3], batch.reference())
    assert torch.equal(out[3:], torch.zeros_like(out[3:]))
    with pytest.raises(ValueError, match="padding_slot"):
        metadata.build_kernel_metadata(spans, BLOCK_SIZE, torch.device(DEVICE), pad_to=(5, 5))


def test_rejects_mismatched_layout() -> None:
    batch = Batch([1], [3], 4, 2, head_dim=32, dtype=torch.float32)
    with pytest.raises(ValueError, match="pool must be"):
        attention.paged_decode(batch.q, batch.pool[0], batch.tables, BLOCK_SIZE, batch.context_lens, 1.0)


class Weights:
    """A random [N, K] weight in int8 and (group_size > 0) int4 with scales in `scale_dtype`, plus a bias."""

    def __init__(self, n: int, k: int, group_size: int, scale_dtype: torch.dtype, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        weight = torch.randn(n, k, generator=generator).add_(0.05)
        self.q8, self.scale8 = (t.to(DEVICE) for t in quantize_int8(weight))
        if group_size:
            packed, scales_and_zeros = quantize_int4_packed(weight, group_size, scale_dtype)
            self.packed, self.scales_and_zeros = packed.to(DEVICE), scales_and_zeros.to(DEVICE)
        self.bias = torch.randn(n, generator=generator).to(DEVICE)
        self.group_size, self.generator = group_size, generator

    def x(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator).add_(0.1).to(dtype).to(DEVICE)


def config(m: int, n: int, k: int, group_size: int = 0, **overrides: int) -> "matmul.MatmulConfig":
    chosen = matmul.choose_config(m, n, k, 132, group_size)
    return matmul.MatmulConfig(**{**chosen.__dict__, **overrides})


def assert_matmul_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    """Relative to the output's scale: a bf16 output is off by its rounding (the interpreter truncates)."""
    assert out.dtype == expected.dtype and out.shape == expected.shape and not out.isnan().any()
    tolerance = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[out.dtype]
    torch.testing.assert_close(
        out.float(), expected.float(), atol=tolerance * expected.float().abs().max(), rtol=0
    )


# rows: gemv (1, 3) and tensor-core (16, 33) paths; N and K not multiples of the tiles
@pytest.mark.parametrize(
    ("m", "dtype"), [(1, torch.bfloat16), (3, torch.float32), (16, torch.bfloat16), (33, torch.float32)]
)
def test_int8_matmul_matches_reference(m: int, dtype: torch.dtype) -> None:
    w = Weights(72, 200, 0, torch.float32, seed=m)
    x = w.x((m, 200), dtype)
    out = matmul.int8_matmul(x, w.q8, w.scale8, w.bias, config=config(m, 72, 200, block_n=16))
    assert_matmul_close(out, reference_int8_matmul(x, w.q8, w.scale8, w.bias))


@pytest.mark.parametrize(
    ("m", "group_size", "dtype"),
    [(1, 32, torch.bfloat16), (3, 64, torch.float32), (3, 32, torch.bfloat16), (16, 32, torch.float32),
     (33, 64, torch.bfloat16)],
)  # fmt: skip
def test_int4_matmul_matches_reference(m: int, group_size: int, dtype: torch.dtype) -> None:
    w = Weights(40, 192, group_size, torch.float32 if dtype == torch.float32 else torch.bfloat16, seed=m)
    x = w.x((m, 192), dtype)
    chosen = config(m, 40, 192, group_size, block_n=16)
    out = matmul.int4_matmul(x, w.packed, w.scales_and_zeros, group_size, config=chosen)
    assert_matmul_close(out, reference_int4_matmul(x, w.packed, w.scales_and_zeros, group_size))


@pytest.mark.parametrize("m", [1, 20])
def test_split_k_and_bias(m: int) -> None:
    w = Weights(24, 256, 32, torch.bfloat16, seed=9)
    x = w.x((m, 256), torch.bfloat16)
    split = config(m, 24, 256, 32, block_n=16, block_k=64, split_k=3)  # 4 K steps over 3 slices
    int8 = matmul.int8_matmul(x, w.q8, w.scale8, w.bias, config=split)
    assert_matmul_close(int8, reference_int8_matmul(x, w.q8, w.scale8, w.bias))
    int4 = matmul.int4_matmul(x, w.packed, w.scales_and_zeros, 32, w.bias, config=split)
    assert_matmul_close(int4, reference_int4_matmul(x, w.packed, w.scales_and_zeros, 32, w.bias))


def test_default_configs_and_batched_input() -> None:
    """choose_config's own picks (gemv, split-K for a small N) on a [2, 3, K] input."""
    w = Weights(32, 1024, 128, torch.bfloat16, seed=10)
    x = w.x((2, 3, 1024), torch.float32)
    assert matmul.choose_config(6, 32, 1024, 132, 128).split_k > 1
    assert matmul.choose_config(1, 128256, 4096, 132).split_k == 1  # an output layer fills the GPU
    out = matmul.int4_matmul(x, w.packed, w.scales_and_zeros, 128)
    assert_matmul_close(out, reference_int4_matmul(x, w.packed, w.scales_and_zeros, 128))
    out = matmul.int8_matmul(x[:, :1], w.q8, w.scale8)
    assert_matmul_close(out, reference_int8_matmul(x[:, :1], w.q8, w.scale8))


@pytest.mark.parametrize("group_size", [0, 128])
def test_gemv_autotuner_picks_the_fastest_config(group_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA M = 1 path: triton.autotune over GEMV_TUNING (3 entries here, a fake clock), then exact."""
    monkeypatch.setattr(matmul, "GEMV_TUNING", matmul.GEMV_TUNING[:3])
    timings = iter([3.0, 1.0, 2.0])

    def fake_bench(kernel_call: object, quantiles: object) -> list[float]:
        kernel_call()
        seconds = next(timings)
        return [seconds] * 3

    tuned = matmul.gemv_autotuner(group_size, do_bench=fake_bench)
    monkeypatch.setitem(matmul._TUNED, group_size, tuned)
    w = Weights(96, 1024, group_size, torch.bfloat16, seed=13)
    x = w.x((1, 1024), torch.bfloat16)
    if group_size:
        weights, expected = (
            (w.packed, w.scales_and_zeros),
            reference_int4_matmul(x, w.packed, w.scales_and_zeros, 128, w.bias),
        )
    else:
        weights, expected = (w.q8, w.scale8), reference_int8_matmul(x, w.q8, w.scale8, w.bias)
    assert_matmul_close(matmul._tuned_gemv(x, *weights, w.bias, 96, group_size), expected)
    assert tuned.best_config.kwargs["BLOCK_N"] == matmul.GEMV_TUNING[1][0]


def test_int4_packing_matches_engine_quantizer() -> None:
    weight = torch.randn(8, 64, generator=torch.Generator().manual_seed(11))
    q, scales_and_zeros = quantize_int4(weight, 32)
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (8, 32)
    assert torch.equal(unpack_int4(packed), q)
    assert torch.equal(packed[0, 0], (q[0, 0] | q[0, 1] << 4).to(torch.uint8))
    ids = torch.tensor([[5, 0], [5, 7]])
    dense = dequantize_int4(q, scales_and_zeros, 32)
    torch.testing.assert_close(int4_rows(ids, packed, scales_and_zeros, 32, torch.float32), dense[ids])
    q8, scale8 = quantize_int8(weight)
    torch.testing.assert_close(int8_rows(ids, q8, scale8, torch.float32), (q8.float() * scale8[:, None])[ids])


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_linear_modules_and_tied_embedding(fmt: str) -> None:
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(12)).to(DEVICE)
    bias = torch.randn(48).to(DEVICE)
    layer = (
        linear.TritonInt8Linear(weight, bias) if fmt == "int8" else linear.TritonInt4Linear(weight, bias, 32)
    )
    x = torch.randn(2, 64).to(DEVICE).bfloat16()
    if fmt == "int8":
        expected = reference_int8_matmul(x, layer.q, layer.scale, bias)
    else:
        expected = reference_int4_matmul(x, layer.packed, layer.scales_and_zeros, 32, bias)
    assert_matmul_close(layer(x), expected)
    exact = x.float() @ weight.T + bias
    budget = 0.02 if fmt == "int8" else 0.2  # relative error of the quantized weight itself
    assert (layer(x).float() - exact).norm() < budget * exact.norm()
    ids = torch.tensor([3, 47, 3]).to(DEVICE)
    rows = linear.QuantizedEmbedding(layer, torch.float32)(ids)
    assert rows.shape == (3, 64) and (rows - weight[ids]).norm() < budget * weight[ids].norm()


def test_rejects_bad_weights() -> None:
    w = Weights(16, 64, 32, torch.float32)
    x = w.x((1, 64), torch.float32)
    with pytest.raises(ValueError, match="int8 weight"):
        matmul.int8_matmul(x, w.q8.float(), w.scale8)
    with pytest.raises(ValueError, match="group size"):
        matmul.int4_matmul(x, w.packed, w.scales_and_zeros, 16)
    with pytest.raises(ValueError, match="int4 weight"):
        matmul.int4_matmul(x[:, :32], w.packed, w.scales_and_zeros, 32)
