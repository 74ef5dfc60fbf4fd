"""Sliding-window attention over the paged KV cache: the step's metadata, restricted to a window.

A query at position p sees keys at positions p - window + 1 .. p (as in transformers' Gemma 3). The
KV cache keeps every position (global layers need them); windowed layers read only the slots inside
the window: each padded group's causal mask becomes a band (causal, and no key `window` or more
positions behind its query) and the group's leading key columns that no query sees any more are
dropped; per-sequence spans (the per_seq layout) are trimmed and masked the same way. Built once per
step and shared by all sliding layers.
"""

from dataclasses import replace

import torch
from torch import Tensor

from backends.local_engine.model.attention import AttentionMetadata, PaddedGroup, SeqSpan


def windowed(meta: AttentionMetadata, window: int) -> AttentionMetadata:
    """`meta` itself when no query can see further back than `window` positions."""
    spans = [_windowed_span(span, window) for span in meta.spans]
    groups = [_windowed_group(group, window) for group in meta.groups]
    unchanged = all(new is old for new, old in zip(spans + groups, meta.spans + meta.groups, strict=True))
    return meta if unchanged else replace(meta, spans=spans, groups=groups)


def band(q_len: int, context_len: int, window: int, device: torch.device) -> Tensor:
    """[q_len, context_len] mask: causal, and no key `window` or more positions behind its query."""
    rows = torch.arange(context_len - q_len, context_len, device=device)[:, None]
    keys = torch.arange(context_len, device=device)[None, :]
    return (keys <= rows) & (keys > rows - window)


def _windowed_span(span: SeqSpan, window: int) -> SeqSpan:
    context_len = len(span.context_slots)
    if context_len <= window:
        return span
    first = max(0, context_len - span.q_len - window + 1)  # the oldest key the first query still sees
    mask = band(span.q_len, context_len, window, span.context_slots.device)[:, first:]
    return SeqSpan(span.q_start, span.q_len, span.context_slots[first:], mask)


def _windowed_group(group: PaddedGroup, window: int) -> PaddedGroup:
    """The group's causal mask (every row sees keys 0 .. its position) narrowed to a band of `window` keys.

    Each padded row keeps its own last key, so padding rows stay never fully masked; key columns before
    the oldest key any row still sees are cut from the group's gather.
    """
    n, max_q, max_context = group.shape
    if max_context <= window:
        return group
    device = group.context_index.device
    if (
        group.mask is None
    ):  # one query per sequence, all contexts full: every row's last key is the last column
        last_key = torch.full((n, 1, 1), max_context - 1, device=device)
    else:
        last_key = group.mask.sum(-1, keepdim=True) - 1  # [n, 1, rows, 1]
    first = max(0, int(last_key.min()) - window + 1)
    keys = torch.arange(first, max_context, device=device)
    mask = (keys <= last_key) & (keys > last_key - window)
    if mask.dim() == 3:
        mask = mask.unsqueeze(1)  # [n, 1, 1, keys] broadcast over the query rows
    context_index = group.context_index.view(n, max_context)[:, first:].flatten()
    start = None if group.context_start is None else group.context_start + first
    return replace(
        group,
        context_index=context_index,
        mask=mask,
        shape=(n, max_q, max_context - first),
        context_start=start,
    )
