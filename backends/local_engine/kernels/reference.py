"""Plain-torch references of the Triton kernels (for tests and for reading): same inputs, fp32 math."""

import torch
import torch.nn.functional as F
from torch import Tensor


def reference_paged_attention(
    q: Tensor, pool: Tensor, block_tables: Tensor, block_size: int, context_lens: Tensor,
    query_start_loc: Tensor, scale: float, window: int = 0,
) -> Tensor:  # fmt: skip
    """One SDPA per sequence over its context gathered through the block table, in fp32."""
    out = torch.zeros_like(q)
    per_kv = q.shape[1] // pool.shape[2]
    for seq in range(context_lens.shape[0]):
        start, end = int(query_start_loc[seq]), int(query_start_loc[seq + 1])
        context_len = int(context_lens[seq])
        if end == start:
            continue
        positions = torch.arange(context_len, device=q.device)
        slots = block_tables[seq].long()[positions // block_size] * block_size + positions % block_size
        keys, values = pool[:, slots].float().repeat_interleave(per_kv, dim=2).transpose(1, 2)  # [H, ctx, D]
        rows = torch.arange(context_len - (end - start), context_len, device=q.device)[:, None]
        visible = positions[None, :] <= rows
        if window:
            visible &= positions[None, :] > rows - window
        queries = q[start:end].float().transpose(0, 1)
        attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=visible, scale=scale)
        out[start:end] = attended.transpose(0, 1).to(q.dtype)
    return out
