"""A paged attention kernel in Triton: queries of many sequences read K/V through their block tables.

One program handles one sequence, one KV head and `block_m` of that sequence's queries; the query heads
that share the KV head are folded into the program's rows (GQA without expanding K/V). Keys are visited
in tiles of `block_n` token slots looked up through the block table, with an online softmax (flash
attention), so no context is ever gathered. Query i of a sequence with `q_len` new tokens and `context`
tokens in all sits at position context - q_len + i and sees keys 0..that position (causal). A decode
step is the case q_len = 1, block_m = 1.

This is the engine's own fallback; `attention_cuda.py` prefers the kernels of `kernels/` when present.
fp32 inputs use exact fp32 dots (`ieee`), so the fp32 engine matches the reference attention.
"""

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with torch's CUDA builds
    triton = None


if triton is not None:
    _NEG = tl.constexpr(-1.0e30)  # finite "minus infinity": a fully masked tile never produces NaN

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, tables_ptr, context_ptr, q_start_ptr, scale,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_b,
        GQA: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
        PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, IEEE: tl.constexpr,
    ):  # fmt: skip
        seq = tl.program_id(0)
        m_block = tl.program_id(1)
        kv_head = tl.program_id(2)
        q_first = tl.load(q_start_ptr + seq)
        q_len = tl.load(q_start_ptr + seq + 1) - q_first
        if m_block * BLOCK_M < q_len:
            context = tl.load(context_ptr + seq)
            rows = tl.arange(0, ROWS)
            query = m_block * BLOCK_M + rows // GQA
            head = kv_head * GQA + rows % GQA
            valid = (rows < BLOCK_M * GQA) & (query < q_len)
            position = tl.where(valid, context - q_len + query, -1)
            dims = tl.arange(0, HEAD_DIM)
            q_offsets = (q_first + query)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
            q = tl.load(q_ptr + q_offsets, mask=valid[:, None], other=0.0)
            acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
            row_max = tl.full([ROWS], _NEG, dtype=tl.float32)
            row_sum = tl.zeros([ROWS], dtype=tl.float32)
            kv_end = tl.minimum(context, context - q_len + (m_block + 1) * BLOCK_M)
            start = 0
            while (
                start < kv_end
            ):  # a while loop: Triton's interpreter (CPU tests) needs a host bound for range
                keys = start + tl.arange(0, BLOCK_N)
                in_range = keys < kv_end
                page = tl.load(tables_ptr + seq * stride_b + keys // PAGE, mask=in_range, other=0)
                slot = page.to(tl.int64) * PAGE + keys % PAGE
                k = tl.load(
                    k_ptr + slot[:, None] * stride_kt + kv_head * stride_kh + dims[None, :],
                    mask=in_range[:, None], other=0.0,
                )  # fmt: skip
                if IEEE:
                    scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
                else:
                    scores = tl.dot(q, tl.trans(k)) * scale
                seen = (keys[None, :] <= position[:, None]) & in_range[None, :]
                scores = tl.where(seen, scores, _NEG)
                new_max = tl.maximum(row_max, tl.max(scores, 1))
                alpha = tl.exp(row_max - new_max)
                p = tl.exp(scores - new_max[:, None])
                p = tl.where(seen, p, 0.0)
                row_sum = row_sum * alpha + tl.sum(p, 1)
                v = tl.load(
                    v_ptr + slot[:, None] * stride_vt + kv_head * stride_vh + dims[None, :],
                    mask=in_range[:, None], other=0.0,
                )  # fmt: skip
                if IEEE:
                    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
                else:
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                row_max = new_max
                start += BLOCK_N
            out = acc / tl.maximum(row_sum, 1e-30)[:, None]
            o_offsets = (q_first + query)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
            tl.store(o_ptr + o_offsets, out.to(o_ptr.dtype.element_ty), mask=valid[:, None])


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def block_m_for(max_q: int, query_group: int) -> int:
    """Queries per program: 1 for decode steps; for prefill about 64 rows (queries x heads per KV head)."""
    if max_q == 1:
        return 1
    return max(1, min(_next_power_of_two(max_q), 64 // _next_power_of_two(query_group)))


def paged_attention_triton(
    q: Tensor, k_pool: Tensor, v_pool: Tensor, block_tables: Tensor, context_lens: Tensor,
    query_start: Tensor, max_q: int, page_size: int, out: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """q [T, H, D]; k_pool/v_pool [num_slots, KVH, D]; block_tables [S, max_blocks] (int32/int64);
    context_lens [S] (all tokens of each sequence, new ones included); query_start [S + 1] (offsets of each
    sequence's queries in q). Returns [T, H, D]. `max_q` (the longest query span) only sizes the grid.
    """
    num_seqs = block_tables.shape[0]
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_pool.shape[1]
    group = heads // kv_heads
    block_m = block_m_for(max_q, group)
    rows = max(16, _next_power_of_two(block_m * group))
    out = torch.empty_like(q) if out is None else out
    grid = (num_seqs, -(-max_q // block_m), kv_heads)
    _paged_attention_kernel[grid](
        q, k_pool, v_pool, out, block_tables, context_lens, query_start, head_dim**-0.5,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        out.stride(0), out.stride(1), block_tables.stride(0),
        GQA=group, BLOCK_M=block_m, ROWS=rows, BLOCK_N=64 if head_dim <= 128 else 32, PAGE=page_size,
        HEAD_DIM=head_dim, IEEE=q.dtype == torch.float32,
    )  # fmt: skip
    return out
