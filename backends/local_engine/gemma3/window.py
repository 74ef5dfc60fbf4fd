"""Sliding-window attention over the paged KV cache: the step's metadata, restricted to a window.

A query at position p sees keys at positions p - window + 1 .. p (as in transformers' Gemma 3). The
KV cache keeps every position (global layers need them); windowed layers read only the slots inside
the window: per-sequence spans are trimmed to the oldest key any of their queries needs and masked,
decode batches get a band mask. Built once per step and shared by all sliding layers.
"""

from dataclasses import replace

import torch
from torch import Tensor

from backends.local_engine.attention import AttentionMetadata, DecodeBatch, PaddedBatch, SeqSpan


def windowed(meta: AttentionMetadata, window: int) -> AttentionMetadata:
    """`meta` itself when no query can see further back than `window` positions."""
    if meta.decode is not None:
        decode = _windowed_decode(meta.decode, window)
        return meta if decode is meta.decode else replace(meta, decode=decode)
    spans = [_windowed_span(span, window) for span in meta.spans]
    if all(new is old for new, old in zip(spans, meta.spans, strict=True)):
        return meta
    padded = None if meta.padded is None else _windowed_padded(meta.padded, meta.spans, window)
    return replace(meta, spans=spans, padded=padded)


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
    return SeqSpan(span.q_start, span.q_len, span.context_slots[first:], mask, fresh_causal=False)


def _windowed_decode(decode: DecodeBatch, window: int) -> DecodeBatch:
    batch, max_context = decode.shape
    if max_context <= window:
        return decode
    device = decode.context_index.device
    if decode.mask is None:
        last = torch.full((batch,), max_context - 1, device=device)
    else:
        last = decode.mask.view(batch, max_context).sum(-1) - 1
    keys = torch.arange(max_context, device=device)
    mask = (keys <= last[:, None]) & (keys > last[:, None] - window)
    return DecodeBatch(decode.context_index, mask.view(batch, 1, 1, max_context), decode.shape)


def _windowed_padded(padded: PaddedBatch, spans: list[SeqSpan], window: int) -> PaddedBatch:
    mask = padded.mask.clone()
    for row, span in enumerate(spans):
        context_len = len(span.context_slots)
        if context_len > window:
            limit = band(span.q_len, context_len, window, mask.device)
            mask[row, 0, : span.q_len, :context_len] &= limit
    return replace(padded, mask=mask)
