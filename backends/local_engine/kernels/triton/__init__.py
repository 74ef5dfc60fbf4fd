"""Triton kernels for the local engine on CUDA (README.md here: layouts, what to call, byte/FLOP counts).

Stable API (signatures kept once committed; new options only as keyword arguments with defaults):

    paged_attention(q, pool, block_tables, block_size, context_lens, query_start_loc, scale, window=0,
                    *, num_splits=1, out=None, block_m=None, block_n=64, num_warps=None, num_stages=2)
    paged_decode(q, pool, block_tables, block_size, context_lens, scale, window=0,
                 *, num_splits=1, out=None, block_n=64, num_warps=4, num_stages=2) -> Tensor
    choose_num_splits(num_seqs, num_kv_heads, max_context_len, num_sms=132) -> int   # split-K for decode
    write_kv(pool, kv, slot_mapping) -> None        # the engine's index_copy_ (no kernel of its own)
    attention_flops_bytes(q_lens, context_lens, num_heads, num_kv_heads, head_dim, element_size, window=0)

    int8_matmul(x, q, scale, bias=None, *, config=None) -> Tensor
    int4_matmul(x, packed, scales_and_zeros, group_size, bias=None, *, config=None) -> Tensor
    MatmulConfig(block_m, block_n, block_k, split_k=1, num_warps=4, num_stages=3); choose_config(m, n, k,
    num_sms, group_size=0) -> MatmulConfig; sm_count(device) -> int
    pack_int4(q) / unpack_int4(packed); quantize_int4_packed(weight, group_size, scale_dtype=torch.bfloat16)
    int8_rows(ids, q, scale, dtype) / int4_rows(ids, packed, scales_and_zeros, group_size, dtype)  # embeddings
    matmul_bytes_flops(m, n, k, weight_bits, group_size, scale_bytes, act_bytes) -> (bytes, flops)

    build_kernel_metadata(spans, block_size, device, pad_to=None, max_blocks=None, padding_slot=None)
        -> KernelMetadata(block_tables, context_lens, query_start_loc, slot_mapping, block_size, max_query_len)
    kernel_attention(q, kv, pool, meta, scale, window=0, num_splits=1) -> Tensor  # attention.paged_attention's place
    TritonInt8Linear(weight, bias, config=None); TritonInt4Linear(weight, bias, group_size,
        scale_dtype=torch.bfloat16, config=None); QuantizedEmbedding(table_linear, dtype)

Importing this package imports triton. Plain-torch references: `kernels.reference`.
"""

from backends.local_engine.kernels.triton.formats import (
    int4_rows,
    int8_rows,
    matmul_bytes_flops,
    pack_int4,
    quantize_int4_packed,
    unpack_int4,
)
from backends.local_engine.kernels.triton.linear import QuantizedEmbedding, TritonInt4Linear, TritonInt8Linear
from backends.local_engine.kernels.triton.metadata import (
    KernelMetadata,
    build_kernel_metadata,
    kernel_attention,
)
from backends.local_engine.kernels.triton.paged_attention import (
    attention_flops_bytes,
    choose_num_splits,
    paged_attention,
    paged_decode,
    write_kv,
)
from backends.local_engine.kernels.triton.quant_matmul import (
    MatmulConfig,
    choose_config,
    int4_matmul,
    int8_matmul,
    sm_count,
)

__all__ = [
    "KernelMetadata",
    "MatmulConfig",
    "QuantizedEmbedding",
    "TritonInt4Linear",
    "TritonInt8Linear",
    "build_kernel_metadata",
    "choose_num_splits",
    "kernel_attention",
    "attention_flops_bytes",
    "choose_config",
    "int4_matmul",
    "int4_rows",
    "int8_matmul",
    "int8_rows",
    "matmul_bytes_flops",
    "pack_int4",
    "paged_attention",
    "paged_decode",
    "quantize_int4_packed",
    "sm_count",
    "unpack_int4",
    "write_kv",
]
