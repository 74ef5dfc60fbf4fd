"""Paged attention over a flat batch of tokens from many sequences (prefill chunks and decode tokens mixed).

The step's metadata is built once (index tensors, masks) and reused by every layer. Read layouts:
- "decode" (chosen by "auto" when every sequence brings one new token): the contexts of all sequences are
  gathered into one padded [batch, max_context] tensor; each KV head's group of query heads is treated as
  that head's queries, so one SDPA call without GQA expansion serves the whole batch;
- "per_seq": gather each sequence's context from the pool and run one SDPA per sequence;
- "padded": gather all contexts into one padded [batch, max_context] tensor and run a single masked SDPA.
"auto" uses decode for decode-only batches and per_seq otherwise (see bench/README.md).
"""

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from backends.local_engine.kv_cache import block_slots

Layout = Literal["auto", "per_seq", "padded"]


@dataclass
class SeqSpan:
    """One sequence's queries [q_start, q_start + q_len) of the flat batch, attending to `context_slots`."""

    q_start: int
    q_len: int
    context_slots: Tensor  # [context_len] slot indices in the pool, oldest first
    mask: Tensor | None  # [q_len, context_len] bool, None when no masking is needed
    fresh_causal: bool  # no earlier context: attend to this step's own K/V with a causal mask


@dataclass
class PaddedBatch:
    q_index: Tensor  # [batch * max_q] row of the flat batch feeding each padded query (0 for padding)
    context_index: Tensor  # [batch * max_context] pool slot for each padded key (0 for padding)
    mask: Tensor  # [batch, 1, max_q, max_context] bool
    out_index: Tensor  # [num_tokens] padded row of each flat token
    shape: tuple[int, int, int]  # batch, max_q, max_context


@dataclass
class DecodeBatch:
    """One new token per sequence, flat row b = sequence b."""

    context_index: Tensor  # [batch * max_context] pool slot for each padded key (slot of block 0 for padding)
    mask: Tensor | None  # [batch, 1, 1, max_context] bool, None when all contexts have the same length
    shape: tuple[int, int]  # batch, max_context


@dataclass
class AttentionMetadata:
    slot_mapping: Tensor  # [num_tokens] pool slot where each new token's K/V is written
    spans: list[SeqSpan]
    padded: PaddedBatch | None = None
    decode: DecodeBatch | None = None


def chunk_mask(q_len: int, context_len: int, device: torch.device) -> Tensor | None:
    """Causal mask for queries at positions context_len - q_len .. context_len - 1."""
    if q_len == 1:
        return None
    rows = torch.arange(context_len - q_len, context_len, device=device)[:, None]
    return torch.arange(context_len, device=device)[None, :] <= rows


def build_metadata(
    spans: list[tuple[list[int], int, int]], block_size: int, device: torch.device, layout: Layout = "auto"
) -> AttentionMetadata:
    """`spans`: per sequence (block_table, num_computed_tokens, num_new_tokens), in flat-batch order."""
    context_lens = [computed + new for _, computed, new in spans]
    slots = block_slots([table for table, _, _ in spans], context_lens, block_size, device)
    if layout == "auto" and all(new == 1 for _, _, new in spans):
        return _decode_metadata(slots, context_lens, device)
    seq_spans, slot_mappings, q_start = [], [], 0
    for row, (_, computed, new) in enumerate(spans):
        context = slots[row, : computed + new]
        slot_mappings.append(context[computed:])
        mask = chunk_mask(new, computed + new, device) if computed else None
        seq_spans.append(SeqSpan(q_start, new, context, mask, fresh_causal=computed == 0 and new > 1))
        q_start += new
    meta = AttentionMetadata(torch.cat(slot_mappings), seq_spans)
    if layout == "padded":
        meta.padded = build_padded(seq_spans, device)
    return meta


def _decode_metadata(slots: Tensor, context_lens: list[int], device: torch.device) -> AttentionMetadata:
    batch, max_context = slots.shape
    last = torch.tensor(context_lens, device=device) - 1
    mask = None
    if min(context_lens) != max_context:
        mask = (torch.arange(max_context, device=device) <= last[:, None]).view(batch, 1, 1, max_context)
    slot_mapping = slots.gather(1, last[:, None]).view(batch)
    return AttentionMetadata(
        slot_mapping, [], decode=DecodeBatch(slots.flatten(), mask, (batch, max_context))
    )


def build_padded(spans: list[SeqSpan], device: torch.device) -> PaddedBatch:
    batch = len(spans)
    max_q = max(span.q_len for span in spans)
    max_context = max(len(span.context_slots) for span in spans)
    q_index = torch.zeros(batch, max_q, dtype=torch.long, device=device)
    context_index = torch.zeros(batch, max_context, dtype=torch.long, device=device)
    mask = torch.zeros(batch, 1, max_q, max_context, dtype=torch.bool, device=device)
    mask[..., 0] = True  # padding queries see one key, so no row is fully masked (no NaNs)
    out_index = []
    for row, span in enumerate(spans):
        context_len = len(span.context_slots)
        q_index[row, : span.q_len] = torch.arange(span.q_start, span.q_start + span.q_len, device=device)
        context_index[row, :context_len] = span.context_slots
        span_mask = chunk_mask(span.q_len, context_len, device)
        mask[row, 0, : span.q_len, :context_len] = True if span_mask is None else span_mask
        out_index.append(torch.arange(span.q_len, device=device) + row * max_q)
    return PaddedBatch(
        q_index.flatten(), context_index.flatten(), mask, torch.cat(out_index), (batch, max_q, max_context)
    )


def paged_attention(q: Tensor, kv: Tensor, pool: Tensor, meta: AttentionMetadata) -> Tensor:
    """q [T, H, D] and kv [T, 2, KVH, D] of the new tokens → attention output [T, H, D].

    `pool` is one layer's [2, num_slots, KVH, D] keys and values; the new K/V are written to it first.
    """
    pool.index_copy_(1, meta.slot_mapping, kv.transpose(0, 1))
    if meta.decode is not None:
        return _decode_attention(q, pool, meta.decode)
    if meta.padded is not None:
        return _padded_attention(q, pool, meta.padded)
    if len(meta.spans) == 1:
        return _span_attention(q, kv, pool, meta.spans[0])
    return torch.cat([_span_attention(q, kv, pool, span) for span in meta.spans])


def _decode_attention(q: Tensor, pool: Tensor, decode: DecodeBatch) -> Tensor:
    batch, max_context = decode.shape
    heads, kv_heads, head_dim = q.shape[1], pool.shape[2], q.shape[2]
    keys, values = pool.index_select(1, decode.context_index).view(2, batch, max_context, kv_heads, head_dim)
    queries = q.view(batch, kv_heads, heads // kv_heads, head_dim)  # query head h uses KV head h // group
    out = F.scaled_dot_product_attention(
        queries, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=decode.mask
    )
    return out.reshape(batch, heads, head_dim)  # CUDA kernels may return [batch, group, kv_heads] strides


def _span_attention(q: Tensor, kv: Tensor, pool: Tensor, span: SeqSpan) -> Tensor:
    rows = slice(span.q_start, span.q_start + span.q_len)
    if span.fresh_causal:
        keys, values = kv[rows].unbind(1)
    else:
        keys, values = pool.index_select(1, span.context_slots)
    out = F.scaled_dot_product_attention(
        q[rows].transpose(0, 1),
        keys.transpose(0, 1),
        values.transpose(0, 1),
        attn_mask=span.mask,
        is_causal=span.fresh_causal,
        enable_gqa=True,
    )
    return out.transpose(0, 1)


def _padded_attention(q: Tensor, pool: Tensor, padded: PaddedBatch) -> Tensor:
    batch, max_q, max_context = padded.shape
    heads, kv_heads, head_dim = q.shape[1], pool.shape[2], q.shape[2]
    queries = q.index_select(0, padded.q_index).view(batch, max_q, heads, head_dim).transpose(1, 2)
    keys, values = pool.index_select(1, padded.context_index).view(2, batch, max_context, kv_heads, head_dim)
    out = F.scaled_dot_product_attention(
        queries, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=padded.mask, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(batch * max_q, heads, head_dim).index_select(0, padded.out_index)
