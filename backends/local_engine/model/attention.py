"""Paged attention over a flat batch of tokens from many sequences (prefill chunks and decode tokens mixed).

The step's metadata is built once (index tensors, masks) and reused by every layer. Layouts:
- "auto": sequences are grouped by how many queries they bring, at most two groups: short spans (decodes
  and speculative verification, <= SHORT_SPAN queries) and long ones (prefill chunks). Each group is one
  variable-length attention call: its contexts are gathered from the pool once per layer into a padded
  [n, max_context] tensor, its queries padded to [n, max_q], and one masked SDPA runs over the group with
  each KV head's query heads folded into that head's query rows (GQA without expanding K/V). Padding stays
  small because a group's spans have similar lengths; a decode row and a verification row go through the
  same kernel with the same block sizes, so speculative decoding reproduces plain decoding's logits;
- "padded": the same with every sequence in one group;
- "per_seq": one gather + SDPA per sequence (the reference the tests compare against).
Measured in studies/README.md (Engine serving).
"""

from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from backends.local_engine.model.kv_cache import block_slots

Layout = Literal["auto", "per_seq", "padded"]
SHORT_SPAN = 16  # decode + up to 15 speculative tokens


@dataclass
class SeqSpan:
    """One sequence's queries [q_start, q_start + q_len) of the flat batch, attending to `context_slots`."""

    q_start: int
    q_len: int
    context_slots: Tensor  # [context_len] slot indices in the pool, oldest first
    mask: Tensor | None  # [q_len, context_len] bool, None when no masking is needed


@dataclass
class PaddedGroup:
    """Sequences attended in one SDPA call: queries padded to max_q, contexts to max_context."""

    q_index: (
        Tensor  # [n * max_q] flat-batch row feeding each padded query (a real row of its own seq for padding)
    )
    context_index: Tensor  # [n * max_context] pool slot of each padded key
    mask: Tensor | None  # [n, 1, max_q * group, max_context] bool (rows: query position, then head in group)
    out_index: Tensor  # [tokens of the group] padded row of each of the group's tokens, in flat order
    flat_rows: Tensor | None  # [tokens of the group] their flat-batch rows; None when the group is the batch
    shape: tuple[int, int, int]  # n, max_q, max_context
    # one query per sequence and the group is the batch: q_index and out_index are 0..n-1
    identity: bool = False
    # a one-sequence group whose context fills pool slots [context_start, context_start + max_context) in
    # order (its blocks are consecutive, as the block manager usually hands them out): attention reads that
    # slice of the pool instead of gathering it
    context_start: int | None = None


@dataclass
class AttentionMetadata:
    slot_mapping: Tensor  # [num_tokens] pool slot where each new token's K/V is written
    spans: list[SeqSpan]  # filled for the per_seq layout only
    groups: list[PaddedGroup]


def chunk_mask(q_len: int, context_len: int, device: torch.device) -> Tensor | None:
    """Causal mask for queries at positions context_len - q_len .. context_len - 1."""
    if q_len == 1:
        return None
    rows = torch.arange(context_len - q_len, context_len, device=device)[:, None]
    return torch.arange(context_len, device=device)[None, :] <= rows


def build_metadata(
    spans: list[tuple[list[int], int, int]],
    block_size: int,
    device: torch.device,
    layout: Layout = "auto",
    query_group: int = 1,
) -> AttentionMetadata:
    """`spans`: per sequence (block_table, num_computed_tokens, num_new_tokens), in flat-batch order.

    `query_group`: query heads per KV head (the model's GQA factor), folded into the query rows.
    """
    computed = [c for _, c, _ in spans]
    new = [n for _, _, n in spans]
    context_lens = [c + n for c, n in zip(computed, new, strict=True)]
    slots = block_slots([table for table, _, _ in spans], context_lens, block_size, device)
    starts = [0, *accumulate(new)][:-1]
    slot_mapping = torch.cat(
        [slots[row, c : c + n] for row, (c, n) in enumerate(zip(computed, new, strict=True))]
    )
    if layout == "per_seq":
        seq_spans = [
            SeqSpan(starts[row], n, slots[row, : c + n], chunk_mask(n, c + n, device) if c or n > 1 else None)
            for row, (c, n) in enumerate(zip(computed, new, strict=True))
        ]
        return AttentionMetadata(slot_mapping, seq_spans, [])
    members = [list(range(len(spans)))]
    if layout == "auto":
        short = [row for row, n in enumerate(new) if n <= SHORT_SPAN]
        long = [row for row, n in enumerate(new) if n > SHORT_SPAN]
        members = [group for group in (short, long) if group]
    groups = [
        _padded_group(rows, slots, computed, new, starts, query_group, whole=len(members) == 1)
        for rows in members
    ]
    for group, rows in zip(groups, members, strict=True):
        if len(rows) == 1:
            table, done, count = spans[rows[0]]
            group.context_start = _contiguous_start(table, done + count, block_size)
    return AttentionMetadata(slot_mapping, [], groups)


def _contiguous_start(table: list[int], context_len: int, block_size: int) -> int | None:
    """First pool slot of a context whose blocks are consecutive (then its slots are too), else None."""
    used = table[: -(-context_len // block_size)]
    return used[0] * block_size if used == list(range(used[0], used[0] + len(used))) else None


def _padded_group(
    rows: list[int], slots: Tensor, computed: list[int], new: list[int], starts: list[int], query_group: int,
    whole: bool,
) -> PaddedGroup:  # fmt: skip
    device = slots.device
    max_q = max(new[row] for row in rows)
    max_context = max(computed[row] + new[row] for row in rows)
    index = torch.tensor(rows, device=device)
    num_new = torch.tensor([new[row] for row in rows], device=device)
    done = torch.tensor([computed[row] for row in rows], device=device)
    offsets = torch.minimum(torch.arange(max_q, device=device)[None, :], num_new[:, None] - 1)  # [n, max_q]
    first = torch.tensor([starts[row] for row in rows], device=device)
    q_index = (first[:, None] + offsets).flatten()
    context_index = slots.index_select(0, index)[:, :max_context].flatten()
    mask = None
    uniform = all(computed[row] + new[row] == max_context for row in rows)
    if max_q > 1 or not uniform:  # padding rows repeat their sequence's last query (never fully masked)
        last_key = done[:, None] + offsets  # [n, max_q]
        keys = torch.arange(max_context, device=device)
        mask = (keys[None, None, :] <= last_key[:, :, None]).repeat_interleave(query_group, dim=1)
        mask = mask.unsqueeze(1)
    padded = (
        torch.arange(max_q, device=device)[None, :] + torch.arange(len(rows), device=device)[:, None] * max_q
    )
    real = torch.arange(max_q, device=device)[None, :] < num_new[:, None]
    out_index = padded[real]
    flat_rows = None if whole else (first[:, None] + torch.arange(max_q, device=device)[None, :])[real]
    identity = whole and max_q == 1  # pure decode step: skip the two row gathers per layer
    return PaddedGroup(
        q_index, context_index, mask, out_index, flat_rows, (len(rows), max_q, max_context), identity
    )


def paged_attention(q: Tensor, kv: Tensor, pool: Tensor, meta: AttentionMetadata) -> Tensor:
    """q [T, H, D] and kv [T, 2, KVH, D] of the new tokens → attention output [T, H, D].

    `pool` is one layer's [2, num_slots, KVH, D] keys and values; the new K/V are written to it first.
    CUDA steps carry attention_cuda.CudaAttentionMetadata and go to its kernel.
    """
    if not isinstance(meta, AttentionMetadata):
        from backends.local_engine.model.attention_cuda import cuda_paged_attention

        return cuda_paged_attention(q, kv, pool, meta)
    pool.index_copy_(1, meta.slot_mapping, kv.transpose(0, 1).to(pool.dtype))
    if pool.dtype != q.dtype:  # a bf16 pool under fp32 activations (CPU): attend in the pool's dtype
        return _attend(q.to(pool.dtype), pool, meta).to(q.dtype)
    return _attend(q, pool, meta)


def _attend(q: Tensor, pool: Tensor, meta: AttentionMetadata) -> Tensor:
    if meta.spans:
        return torch.cat([_span_attention(q, pool, span) for span in meta.spans])
    if len(meta.groups) == 1 and meta.groups[0].flat_rows is None:
        return _group_attention(q, pool, meta.groups[0])
    out = torch.empty_like(q)
    for group in meta.groups:
        out.index_copy_(0, group.flat_rows, _group_attention(q, pool, group))
    return out


def _group_attention(q: Tensor, pool: Tensor, group: PaddedGroup) -> Tensor:
    """One SDPA over the group; each KV head's query heads become extra query rows of that head."""
    n, max_q, max_context = group.shape
    heads, kv_heads, head_dim = q.shape[1], pool.shape[2], q.shape[2]
    per_kv = heads // kv_heads
    queries = (q if group.identity else q.index_select(0, group.q_index)).view(
        n, max_q, kv_heads, per_kv, head_dim
    )
    queries = queries.transpose(1, 2).reshape(n, kv_heads, max_q * per_kv, head_dim)
    if group.context_start is not None:
        keys, values = pool[:, group.context_start : group.context_start + max_context].unsqueeze(1)
    else:
        keys, values = pool.index_select(1, group.context_index).view(2, n, max_context, kv_heads, head_dim)
    out = F.scaled_dot_product_attention(
        queries, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=group.mask
    )
    out = out.view(n, kv_heads, max_q, per_kv, head_dim).transpose(1, 2).reshape(n * max_q, heads, head_dim)
    return out if group.identity else out.index_select(0, group.out_index)


def _span_attention(q: Tensor, pool: Tensor, span: SeqSpan) -> Tensor:
    rows = slice(span.q_start, span.q_start + span.q_len)
    keys, values = pool.index_select(1, span.context_slots)
    out = F.scaled_dot_product_attention(
        q[rows].transpose(0, 1),
        keys.transpose(0, 1),
        values.transpose(0, 1),
        attn_mask=span.mask,
        enable_gqa=True,
    )
    return out.transpose(0, 1)
