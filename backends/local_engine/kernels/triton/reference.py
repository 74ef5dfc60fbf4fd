"""Plain-torch references of the Triton kernels (for tests and for reading): same inputs, fp32 math."""

import torch
import torch.nn.functional as F
from torch import Tensor

from backends.local_engine.kernels.quantize import dequantize_int4
from backends.local_engine.kernels.triton.formats import unpack_int4


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


def reference_int8_matmul(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ (q * scale).T (+ bias) in fp32, returned in x's dtype."""
    out = x.float() @ (q.float() * scale.float()[:, None]).T
    return (out if bias is None else out + bias.float()).to(x.dtype)


def reference_int4_matmul(
    x: Tensor, packed: Tensor, scales_and_zeros: Tensor, group_size: int, bias: Tensor | None = None
) -> Tensor:
    """x @ W.T (+ bias) in fp32 with W dequantized by quant.dequantize_int4, returned in x's dtype."""
    weight = dequantize_int4(unpack_int4(packed), scales_and_zeros.float(), group_size)
    out = x.float() @ weight.T
    return (out if bias is None else out + bias.float()).to(x.dtype)
