"""Paged attention over a flat batch of tokens from many sequences (prefill chunks and decode tokens mixed).

The step's metadata is built once (index tensors, masks) and reused by every layer. Two read layouts:
- "per_seq": gather each sequence's context from the pool and run one SDPA per sequence;
- "padded": gather all contexts into one padded [batch, max_context] tensor and run a single masked SDPA.
"auto" uses padded for batches of several decode-only sequences and per_seq otherwise (see bench/README.md).
"""

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from backends.local_engine.kv_cache import slots_for

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
class AttentionMetadata:
    slot_mapping: Tensor  # [num_tokens] pool slot where each new token's K/V is written
    spans: list[SeqSpan]
    padded: PaddedBatch | None = None


def chunk_mask(q_len: int, context_len: int, device: torch.device) -> Tensor | None:
    """Causal mask for queries at positions context_len - q_len .. context_len - 1."""
    if q_len == 1:
        return None
    rows = torch.arange(context_len - q_len, context_len, device=device)[:, None]
    return torch.arange(context_len, device=device)[None, :] <= rows


def build_metadata(
    spans: list[tuple[Tensor, int, int]], block_size: int, device: torch.device, layout: Layout = "auto"
) -> AttentionMetadata:
    """`spans`: per sequence (block_table tensor, num_computed_tokens, num_new_tokens), in flat-batch order."""
    seq_spans, slot_mappings, q_start = [], [], 0
    for block_table, computed, new in spans:
        context = slots_for(block_table, 0, computed + new, block_size)
        slot_mappings.append(context[computed:])
        mask = chunk_mask(new, computed + new, device) if computed else None
        seq_spans.append(SeqSpan(q_start, new, context, mask, fresh_causal=computed == 0 and new > 1))
        q_start += new
    meta = AttentionMetadata(torch.cat(slot_mappings), seq_spans)
    if _use_padded(layout, seq_spans):
        meta.padded = build_padded(seq_spans, device)
    return meta


def _use_padded(layout: Layout, spans: list[SeqSpan]) -> bool:
    if layout == "auto":
        return len(spans) > 1 and all(span.q_len == 1 for span in spans)
    return layout == "padded"


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


def paged_attention(
    q: Tensor, k: Tensor, v: Tensor, k_pool: Tensor, v_pool: Tensor, meta: AttentionMetadata
) -> Tensor:
    """q [T, H, D], k/v [T, KVH, D] for the new tokens → attention output [T, H, D]; writes k/v to the pool."""
    k_pool.index_copy_(0, meta.slot_mapping, k)
    v_pool.index_copy_(0, meta.slot_mapping, v)
    if meta.padded is not None:
        return _padded_attention(q, k_pool, v_pool, meta.padded)
    if len(meta.spans) == 1:
        return _span_attention(q, k, v, k_pool, v_pool, meta.spans[0])
    return torch.cat([_span_attention(q, k, v, k_pool, v_pool, span) for span in meta.spans])


def _span_attention(q: Tensor, k: Tensor, v: Tensor, k_pool: Tensor, v_pool: Tensor, span: SeqSpan) -> Tensor:
    rows = slice(span.q_start, span.q_start + span.q_len)
    if span.fresh_causal:
        keys, values = k[rows], v[rows]
    else:
        keys, values = k_pool.index_select(0, span.context_slots), v_pool.index_select(0, span.context_slots)
    out = F.scaled_dot_product_attention(
        q[rows].transpose(0, 1),
        keys.transpose(0, 1),
        values.transpose(0, 1),
        attn_mask=span.mask,
        is_causal=span.fresh_causal,
        enable_gqa=True,
    )
    return out.transpose(0, 1)


def _padded_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, padded: PaddedBatch) -> Tensor:
    batch, max_q, max_context = padded.shape
    heads, kv_heads, head_dim = q.shape[1], k_pool.shape[1], q.shape[2]
    queries = q.index_select(0, padded.q_index).view(batch, max_q, heads, head_dim).transpose(1, 2)
    keys = k_pool.index_select(0, padded.context_index).view(batch, max_context, kv_heads, head_dim)
    values = v_pool.index_select(0, padded.context_index).view(batch, max_context, kv_heads, head_dim)
    out = F.scaled_dot_product_attention(
        queries, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=padded.mask, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(batch * max_q, heads, head_dim).index_select(0, padded.out_index)
