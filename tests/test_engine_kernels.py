"""Triton kernels of the local engine (backends/local_engine/kernels) against torch references.

On CPU the kernels run in Triton's interpreter (tests/triton_interpreter_support.py sets it up); with
KERNEL_TEST_DEVICE=cuda the same cases run compiled on the GPU. Inputs are random (never zeros), outputs
start as NaN so every row the kernel should write is checked, and the batches mix decodes, prefill chunks
with and without cached context, padding sequences, GQA / MQA / non-power-of-two head counts, sliding
windows, contexts ending on and around block boundaries, and split-K.
"""

from tests.triton_interpreter_support import DEVICE, kernel_module  # first: sets up the interpreter

# isort: split

import pytest
import torch

from backends.local_engine.attention import build_metadata
from backends.local_engine.attention import paged_attention as engine_attention
from backends.local_engine.gemma3.window import windowed
from backends.local_engine.kernels.reference import reference_paged_attention

attention = kernel_module("backends.local_engine.kernels.paged_attention")

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
HEADS = {"gqa": (4, 2), "gqa3": (6, 2), "mha3": (3, 3), "mqa": (4, 1)}


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("heads", HEADS)
def test_varlen_matches_reference(mix: str, heads: str) -> None:
    batch = Batch(*MIXES[mix], *HEADS[heads], head_dim=32, dtype=torch.float32)
    assert_close(batch.varlen(block_m=16, block_n=16), batch.reference())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen_half_precision_large_tiles(dtype: torch.dtype) -> None:
    batch = Batch([1, 40, 2, 70], [90, 40, 33, 75], 8, 2, head_dim=64, dtype=dtype, seed=1)
    assert_close(batch.varlen(), batch.reference())


@pytest.mark.parametrize("window", [1, 5, 16])
def test_sliding_window(window: int) -> None:
    batch = Batch([1, 9, 1, 20], [30, 21, 3, 20], 4, 2, head_dim=32, dtype=torch.float32, seed=2)
    assert_close(batch.varlen(window, block_m=16, block_n=8), batch.reference(window))


@pytest.mark.parametrize("num_splits", [2, 3])
@pytest.mark.parametrize("window", [0, 6])
def test_split_k(num_splits: int, window: int) -> None:
    batch = Batch([1, 5, 1, 0], [37, 29, 2, 9], 4, 2, head_dim=32, dtype=torch.bfloat16, seed=3)
    assert_close(batch.varlen(window, block_m=16, block_n=8, num_splits=num_splits), batch.reference(window))


def test_head_dim_not_power_of_two() -> None:
    batch = Batch([2, 1, 6], [9, 12, 6], 4, 2, head_dim=48, dtype=torch.float32, seed=4)
    assert_close(batch.varlen(block_m=16, block_n=16), batch.reference())


@pytest.mark.parametrize(("num_splits", "window"), [(1, 0), (4, 0), (1, 7), (3, 7)])
def test_decode_at_block_boundaries(num_splits: int, window: int) -> None:
    context_lens = [BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 4 * BLOCK_SIZE, 4 * BLOCK_SIZE + 1, 1]
    batch = Batch([1] * len(context_lens), context_lens, 8, 2, head_dim=32, dtype=torch.bfloat16, seed=5)
    out = torch.full_like(batch.q, float("nan"))
    attention.paged_decode(
        batch.q, batch.pool, batch.tables, BLOCK_SIZE, batch.context_lens, batch.scale, window,
        num_splits=num_splits, out=out, block_n=8,
    )  # fmt: skip
    assert_close(out, batch.reference(window))


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
def test_matches_engine_attention(window: int) -> None:
    """The kernel against attention.py's per_seq and auto layouts (Gemma's window through gemma3.window)."""
    q_lens, context_lens = [1, 6, 1, 11], [14, 6, 3, 19]
    batch = Batch(q_lens, context_lens, 6, 2, head_dim=32, dtype=torch.float32, seed=7)
    spans = [(batch.tables[s].tolist(), context_lens[s] - q_lens[s], q_lens[s]) for s in range(len(q_lens))]
    slot_mapping = build_metadata(spans, BLOCK_SIZE, torch.device(DEVICE), "per_seq").slot_mapping
    new_kv = batch.pool[:, slot_mapping].transpose(0, 1).clone()  # re-written in place by the engine
    for layout in ("per_seq", "auto"):
        meta = build_metadata(spans, BLOCK_SIZE, torch.device(DEVICE), layout, query_group=3)
        meta = windowed(meta, window) if window else meta
        expected = engine_attention(batch.q, new_kv, batch.pool, meta)
        assert_close(batch.varlen(window, block_m=16, block_n=8), expected)


def test_rejects_mismatched_layout() -> None:
    batch = Batch([1], [3], 4, 2, head_dim=32, dtype=torch.float32)
    with pytest.raises(ValueError, match="pool must be"):
        attention.paged_decode(batch.q, batch.pool[0], batch.tables, BLOCK_SIZE, batch.context_lens, 1.0)
