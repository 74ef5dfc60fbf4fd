"""Paged attention in Triton: one launch per layer for a flat batch of decodes and prefill chunks.

Layouts (the engine's, see kv_cache.py):
- `pool`: one layer's [2, num_slots, num_kv_heads, head_dim] keys (pool[0]) and values (pool[1]);
  token position `p` of a sequence lives in slot `block_tables[seq, p // block_size] * block_size
  + p % block_size`. The kernel reads K/V through the block table; no context is gathered.
- `q`: [num_tokens, num_heads, head_dim], sequences' new tokens back to back; sequence `s` owns rows
  `query_start_loc[s] .. query_start_loc[s + 1]`, at positions `context_lens[s] - q_len .. context_lens[s]`
  (`context_lens` counts the new tokens too, whose K/V must already be in the pool: write them first).
- A query at position `p` sees keys `k <= p` and, when `window > 0`, `k > p - window` (Gemma 3's band).

Program tile: one KV head and BLOCK_Q query tokens of one sequence; its rows are (token, query head of
that KV head), so each K/V tile is read once for all query heads that share it (GQA without expanding
K/V). Rows are padded to a power of two per KV head (GROUP) and to at least 16 (tl.dot's minimum).
Online softmax (flash attention) over key tiles of BLOCK_N, in the log2 domain, fp32 accumulation.

Split-K (flash decoding): with `num_splits > 1` every program's key range is cut into that many equal
slices run by separate programs; each writes its unnormalised accumulator and (max, sum) to an fp32
workspace and a second small kernel combines them. Use it for long contexts at small batch, where
num_seqs * num_kv_heads programs would leave most SMs idle.

All grid sizes depend only on (num_tokens, num_seqs, num_heads, num_splits) and all metadata are device
tensors, so one call can be captured in a CUDA graph and replayed with new metadata of the same shapes.
Padding sequences are allowed: q_len 0 (varlen) or context_len 0 (decode, output row = 0).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

LOG2E = 1.4426950408889634


@triton.jit
def _find_seq(query_start_loc, pid, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence whose query blocks contain program `pid` (sequence s starts at qsl[s] // BLOCK_Q + s)."""
    left: tl.int32 = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        start = tl.load(query_start_loc + mid) // BLOCK_Q + mid
        if start <= pid:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, acc_ptr, ml_ptr,
    block_tables, context_lens, query_start_loc,
    scale_log2, window, num_seqs, num_tokens,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_ks, stride_kh, stride_bt,
    NUM_HEADS: tl.constexpr, PER_KV: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DECODE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if DECODE:
        seq = pid
        q_start = pid
        q_len = 1
        q_block = 0
    else:
        seq = _find_seq(query_start_loc, pid, num_seqs, BLOCK_Q)
        q_start = tl.load(query_start_loc + seq)
        q_len = tl.load(query_start_loc + seq + 1) - q_start
        q_block = pid - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return
    context_len = tl.load(context_lens + seq)

    rows = tl.arange(0, BLOCK_M)
    token = q_block * BLOCK_Q + rows // GROUP  # within the sequence's new tokens
    head = kv_head * PER_KV + rows % GROUP
    row_ok = (token < q_len) & (rows % GROUP < PER_KV) & (rows // GROUP < BLOCK_Q)
    position = context_len - q_len + token
    dims = tl.arange(0, D_PAD)
    dim_ok = dims < HEAD_DIM
    q_rows = (q_start + token) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    lower = tl.where(window > 0, position - window, -1)  # keys must lie above this (and <= position)

    # key tiles this program needs: from the oldest key its first query sees to its last query
    first_pos = context_len - q_len + q_block * BLOCK_Q
    end = tl.minimum(first_pos + BLOCK_Q, context_len)
    start = tl.where(window > 0, tl.maximum(first_pos - window + 1, 0), 0)
    tile_lo = start // BLOCK_N
    tile_hi = (end + BLOCK_N - 1) // BLOCK_N
    per_split = (tile_hi - tile_lo + NUM_SPLITS - 1) // NUM_SPLITS
    split_lo = tile_lo + split * per_split
    split_hi = tl.minimum(split_lo + per_split, tile_hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    table = block_tables + seq * stride_bt
    for tile in range(split_lo, split_hi):
        keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        key_ok = keys < end
        block = tl.load(table + keys // BLOCK_SIZE, mask=key_ok, other=0)
        slot = (block.to(tl.int64) * BLOCK_SIZE + keys % BLOCK_SIZE) * stride_ks + kv_head * stride_kh
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + slot[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        visible = key_ok[None, :] & (keys[None, :] <= position[:, None]) & (keys[None, :] > lower[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + slot[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out_rows = q_start + token
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        out_offsets = out_rows * stride_ot + head * stride_oh
        store_mask = row_ok[:, None] & dim_ok[None, :]
        tl.store(
            out_ptr + out_offsets[:, None] + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=store_mask
        )
    else:
        part = (split * num_tokens + out_rows) * NUM_HEADS + head  # [NUM_SPLITS, T, H] row
        tl.store(acc_ptr + part[:, None] * D_PAD + dims[None, :], acc, mask=row_ok[:, None])
        tl.store(ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _combine_splits_kernel(
    acc_ptr, ml_ptr, out_ptr, num_tokens, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr, S_PAD: tl.constexpr,
):  # fmt: skip
    """out[t, h] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over the splits (M = max_s m_s)."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, S_PAD)
    split_ok = splits < NUM_SPLITS
    part = (splits * num_tokens + token) * NUM_HEADS + head
    m = tl.load(ml_ptr + part * 2, mask=split_ok, other=float("-inf"))
    l_s = tl.load(ml_ptr + part * 2 + 1, mask=split_ok, other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    weight = tl.exp2(m - m_max)
    total = tl.sum(weight * l_s, 0)
    dims = tl.arange(0, D_PAD)
    acc = tl.load(acc_ptr + part[:, None] * D_PAD + dims[None, :], mask=split_ok[:, None], other=0.0)
    out = tl.sum(acc * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    out_offsets = token * stride_ot + head * stride_oh + dims
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def paged_attention(
    q: Tensor, pool: Tensor, block_tables: Tensor, block_size: int, context_lens: Tensor,
    query_start_loc: Tensor, scale: float, window: int = 0, *, num_splits: int = 1, out: Tensor | None = None,
    block_m: int | None = None, block_n: int = 64, num_warps: int | None = None, num_stages: int = 2,
) -> Tensor:  # fmt: skip
    """Varlen paged attention of a mixed step (any q_len >= 0 per sequence), one launch (two with splits).

    q [T, H, D]; pool [2, slots, KVH, D]; block_tables [S, max_blocks] int32 (padded); block_size: pool
    slots per block; context_lens [S] int32 (cached + new tokens); query_start_loc [S + 1] int32 (rows of
    q per sequence, ascending); scale multiplies q·k; window 0 = full causal, else keys within `window`
    positions of the query. Returns (or fills `out`, [T, H, D]) in q's dtype. block_m / num_warps default
    to 64 / 4 for 16-bit inputs (8 warps above head_dim 128) and 32 / 8 for fp32: the sm_90 compile check
    (tests/sm90_compile_check.py) spills registers at 64 / 4 with fp32's IEEE dots or head_dim 256.
    """
    return _launch(
        q, pool, block_tables, block_size, context_lens, query_start_loc, scale, window, num_splits, out,
        block_m, block_n, num_warps, num_stages,
    )  # fmt: skip


def paged_decode(
    q: Tensor, pool: Tensor, block_tables: Tensor, block_size: int, context_lens: Tensor, scale: float,
    window: int = 0, *, num_splits: int = 1, out: Tensor | None = None, block_n: int = 64,
    num_warps: int = 4, num_stages: int = 2,
) -> Tensor:  # fmt: skip
    """Decode step: one query token per sequence (q row s belongs to sequence s); no query_start_loc."""
    return _launch(
        q, pool, block_tables, block_size, context_lens, None, scale, window, num_splits, out,
        16, block_n, num_warps, num_stages,
    )  # fmt: skip


def _launch(
    q: Tensor, pool: Tensor, block_tables: Tensor, block_size: int, context_lens: Tensor,
    query_start_loc: Tensor | None, scale: float, window: int, num_splits: int, out: Tensor | None,
    block_m: int | None, block_n: int, num_warps: int | None, num_stages: int,
) -> Tensor:  # fmt: skip
    num_tokens, num_heads, head_dim = q.shape
    varlen_fp32 = q.dtype == torch.float32 and query_start_loc is not None
    block_m = block_m or (32 if varlen_fp32 else 64)
    num_warps = num_warps or (8 if varlen_fp32 or (query_start_loc is not None and head_dim > 128) else 4)
    num_kv_heads = pool.shape[2]
    if pool.dim() != 4 or pool.shape[0] != 2 or pool.shape[3] != head_dim or pool.stride(3) != 1:
        raise ValueError(
            f"pool must be [2, slots, kv_heads, {head_dim}] with unit last stride, got {pool.shape}"
        )
    if num_heads % num_kv_heads or q.stride(2) != 1 or pool.dtype != q.dtype:
        raise ValueError("q must be [T, H, D] (unit last stride, pool's dtype) with H a multiple of KV heads")
    if block_n < 16 or block_n & (block_n - 1) or block_m & (block_m - 1):
        raise ValueError(
            f"block_n must be a power of two >= 16 and block_m a power of two, got {block_n}, {block_m}"
        )
    per_kv = num_heads // num_kv_heads
    group = triton.next_power_of_2(per_kv)
    decode = query_start_loc is None
    block_m = max(16, group) if decode else max(block_m, group, 16)
    num_seqs = context_lens.shape[0]
    block_q = 1 if decode else block_m // group
    out = torch.empty_like(q) if out is None else out
    d_pad = max(16, triton.next_power_of_2(head_dim))
    acc = ml = out  # unused placeholders when there is no split
    if num_splits > 1:
        acc = torch.empty(num_splits, num_tokens, num_heads, d_pad, dtype=torch.float32, device=q.device)
        ml = torch.empty(num_splits, num_tokens, num_heads, 2, dtype=torch.float32, device=q.device)
    num_programs = num_seqs if decode else num_tokens // block_q + num_seqs
    grid = (num_programs, num_kv_heads, num_splits)
    _paged_attention_kernel[grid](
        q, pool[0], pool[1], out, acc, ml, block_tables, context_lens,
        context_lens if query_start_loc is None else query_start_loc,
        scale * LOG2E, window, num_seqs, num_tokens,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), pool.stride(1), pool.stride(2),
        block_tables.stride(0),
        NUM_HEADS=num_heads, PER_KV=per_kv, GROUP=group, HEAD_DIM=head_dim, D_PAD=d_pad,
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n, NUM_SPLITS=num_splits,
        DECODE=decode, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if num_splits > 1:
        _combine_splits_kernel[(num_tokens, num_heads)](
            acc, ml, out, num_tokens, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, D_PAD=d_pad, NUM_SPLITS=num_splits,
            S_PAD=triton.next_power_of_2(num_splits),
        )  # fmt: skip
    return out


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, num_sms: int = 132) -> int:
    """Split-K count for a decode step: enough programs for ~2 per SM, each slice >= 256 keys, <= 16.

    num_splits is a compile-time constant: CUDA-graph buckets should fix it per (batch, context) bucket.
    """
    programs = max(1, num_seqs * num_kv_heads)
    splits = 1
    while splits < 16 and programs * splits < 2 * num_sms and max_context_len >= 2 * splits * 256:
        splits *= 2
    return splits


def write_kv(pool: Tensor, kv: Tensor, slot_mapping: Tensor) -> None:
    """Write new tokens' kv [T, 2, KVH, D] into their slots (the engine's own index_copy_, one kernel)."""
    pool.index_copy_(1, slot_mapping, kv.transpose(0, 1))


def attention_flops_bytes(
    q_lens: list[int], context_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
    element_size: int, window: int = 0,
) -> tuple[int, int]:  # fmt: skip
    """(FLOPs, minimum bytes moved) of one call: 4·D per visible (query, key, head); K/V read once per KV
    head and sequence, q read and out written once."""
    flops = 0
    kv_bytes = 0
    for q_len, ctx in zip(q_lens, context_lens, strict=True):
        for position in range(ctx - q_len, ctx):
            flops += 4 * head_dim * num_heads * (min(position + 1, window) if window else position + 1)
        seen = min(ctx, window + q_len - 1) if window else ctx
        kv_bytes += 2 * seen * num_kv_heads * head_dim * element_size
    qo_bytes = 2 * sum(q_lens) * num_heads * head_dim * element_size
    return flops, kv_bytes + qo_bytes
