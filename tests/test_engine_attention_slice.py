"""A one-sequence attention group whose blocks are consecutive reads a slice of the KV pool instead of
gathering it (attention.PaddedGroup.context_start): same output as the gather, also windowed (Gemma 3)."""

from dataclasses import replace

import pytest
import torch

from backends.local_engine.model.attention import AttentionMetadata, build_metadata, paged_attention
from backends.local_engine.model.gemma3.window import windowed

BLOCK_SIZE, HEADS, KV_HEADS, HEAD_DIM, NUM_BLOCKS = 4, 6, 2, 8, 16


def _inputs(seed: int, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    pool = torch.randn(2, NUM_BLOCKS * BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=generator)
    q = torch.randn(new_tokens, HEADS, HEAD_DIM, generator=generator)
    kv = torch.randn(new_tokens, 2, KV_HEADS, HEAD_DIM, generator=generator)
    return pool, q, kv


def _gathered(meta: AttentionMetadata) -> AttentionMetadata:
    return replace(meta, groups=[replace(group, context_start=None) for group in meta.groups])


def _attend(meta: AttentionMetadata, pool: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return paged_attention(q, kv, pool.clone(), meta)


@pytest.mark.parametrize(("computed", "new"), [(13, 1), (9, 4), (0, 7), (30, 1)])
@pytest.mark.parametrize("window", [None, 5])
def test_consecutive_blocks_read_a_slice_with_the_gathers_result(computed, new, window):
    table = [3, 4, 5, 6, 7, 8, 9, 10]  # consecutive
    pool, q, kv = _inputs(computed + new, new)
    meta = build_metadata([(table, computed, new)], BLOCK_SIZE, pool.device, query_group=HEADS // KV_HEADS)
    assert meta.groups[0].context_start == 3 * BLOCK_SIZE
    gathered = _gathered(meta)
    if window:
        meta, gathered = windowed(meta, window), windowed(gathered, window)
    per_seq = build_metadata([(table, computed, new)], BLOCK_SIZE, pool.device, layout="per_seq")
    sliced = _attend(meta, pool, q, kv)
    assert torch.equal(sliced, _attend(gathered, pool, q, kv))
    if not window:
        torch.testing.assert_close(sliced, _attend(per_seq, pool, q, kv))


def test_scattered_blocks_and_batches_still_gather():
    scattered = [5, 2, 9, 10]
    meta = build_metadata([(scattered, 10, 1)], BLOCK_SIZE, torch.device("cpu"), query_group=3)
    assert meta.groups[0].context_start is None
    batch = [([0, 1, 2], 9, 1), ([3, 4, 5], 9, 1)]
    meta = build_metadata(batch, BLOCK_SIZE, torch.device("cpu"), query_group=3)
    assert meta.groups[0].context_start is None
