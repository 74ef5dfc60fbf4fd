"""Triton kernels for the local engine on CUDA (see README.md here for layouts and byte/FLOP counts).

Stable API (signatures kept once committed; new options only as keyword arguments with defaults):

    paged_attention(q, pool, block_tables, block_size, context_lens, query_start_loc, scale, window=0,
                    *, num_splits=1, out=None, block_m=64, block_n=64, num_warps=4, num_stages=2) -> Tensor
    paged_decode(q, pool, block_tables, block_size, context_lens, scale, window=0,
                 *, num_splits=1, out=None, block_n=64, num_warps=4, num_stages=2) -> Tensor
    write_kv(pool, kv, slot_mapping) -> None        # the engine's index_copy_ (no kernel of its own)
    attention_flops_bytes(q_lens, context_lens, num_heads, num_kv_heads, head_dim, element_size, window=0)

Importing this package imports triton; plain-torch references live in `kernels.reference` (no triton).
"""

from backends.local_engine.kernels.paged_attention import (
    attention_flops_bytes,
    paged_attention,
    paged_decode,
    write_kv,
)

__all__ = ["attention_flops_bytes", "paged_attention", "paged_decode", "write_kv"]
