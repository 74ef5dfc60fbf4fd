"""Paged attention on CUDA: one kernel call per layer reads K/V through the block tables.

A step's metadata is a handful of index tensors (block tables, context lengths, query offsets, slot
mapping) that every layer shares; none of it depends on the contexts' contents, so a decode step with
fixed-size buffers can be captured once in a CUDA graph and replayed (cuda_graphs.py). The kernel is
the Triton one of `kernels/` when that package provides it, else the engine's own (kernels/triton/attention.py).
The CPU path (attention.py) is unchanged.
"""

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from backends.local_engine.kernels.triton.attention import paged_attention_triton

AttentionKernel = Callable[[Tensor, Tensor, "CudaAttentionMetadata"], Tensor]  # (q, pool, meta) -> out


@dataclass
class CudaAttentionMetadata:
    slot_mapping: Tensor  # [T] int64: pool slot each new token's K/V is written to
    block_tables: Tensor  # [S, max_blocks] int32 (padding entries point at any valid block)
    context_lens: Tensor  # [S] int32: cached + new tokens of each sequence
    query_start: Tensor  # [S + 1] int32: offsets of each sequence's new tokens in the flat batch
    max_q: int  # the longest span of new tokens (1 for a decode step: row s is sequence s)
    page_size: int  # tokens per KV block


def _own_kernel(q: Tensor, pool: Tensor, meta: CudaAttentionMetadata) -> Tensor:
    return paged_attention_triton(
        q, pool[0], pool[1], meta.block_tables, meta.context_lens, meta.query_start, meta.max_q,
        meta.page_size,
    )  # fmt: skip


def _kernels_package() -> AttentionKernel | None:
    """kernels/ (paged_decode for decode steps, paged_attention for mixed ones)."""
    try:
        import backends.local_engine.kernels.triton as module
    except ImportError:
        return None
    if not all(hasattr(module, name) for name in ("paged_attention", "paged_decode")):
        return None

    def run(q: Tensor, pool: Tensor, meta: CudaAttentionMetadata) -> Tensor:
        scale = q.shape[-1] ** -0.5
        seqs, kv_heads = meta.block_tables.shape[0], pool.shape[2]
        if meta.max_q == 1 and seqs == q.shape[0]:
            splits = num_splits(seqs * kv_heads)
            return module.paged_decode(
                q, pool, meta.block_tables, meta.page_size, meta.context_lens, scale, num_splits=splits
            )
        splits = num_splits((q.shape[0] // 16 + seqs) * kv_heads)
        block_n = SPLIT_BLOCK_N if splits > 1 and q.element_size() == 2 else 64
        return module.paged_attention(
            q, pool, meta.block_tables, meta.page_size, meta.context_lens, meta.query_start, scale,
            num_splits=splits, block_n=block_n,
        )  # fmt: skip

    return run


# key tile of split-K mixed steps in 16-bit: 128 keys measured 12.8 against 64's 14.3 us a layer for a
# prefix-cached 32-token tail over 1056 keys on the H200 (studies/engine_gpu_prefix.py --attention-sweep), and
# the cached request 5.51 against 5.62 ms in the engine (studies/README.md), so the 64-key switch
# (LLMGW_ATTENTION_SPLIT_BLOCK_N) is gone
SPLIT_BLOCK_N = 128
_MOST_SPLITS = [8]  # the engine setting attention_max_splits (`configure`)


def num_splits(programs: int, target: int = 256, most: int | None = None) -> int:
    """Split-K count for a step of `programs` (query block, KV head) programs: a power of two, at most
    `most`, until about `target` programs run (the H200 has 132 SMs). It depends on shapes only, not on the
    context lengths, so a captured graph keeps it; splits left without keys cost an empty program. Steps
    with few query blocks over long contexts (a prefix-cached prompt's tail, small-batch decode) are
    otherwise a few dozen programs walking every key tile in turn. `most` None: the engine setting
    attention_max_splits (1 turns split-K off)."""
    limit = _MOST_SPLITS[0] if most is None else most
    splits = 1
    while splits < limit and programs * splits < target:
        splits *= 2
    return splits


KERNELS: dict[str, Callable[[], AttentionKernel | None]] = {
    "kernels": _kernels_package,
    "own": lambda: _own_kernel,
}
_ACTIVE: list[AttentionKernel] = []


def kernel() -> AttentionKernel:
    """The kernel `configure` chose; unconfigured, kernels/triton's when importable, else the engine's own."""
    if not _ACTIVE:
        _ACTIVE.append(_kernels_package() or _own_kernel)
    return _ACTIVE[0]


def configure(attention_kernel: str = "auto", max_splits: int = 8) -> None:
    """The engine settings attention_kernel ("auto", "kernels" or "own") and attention_max_splits, set by the
    model runner when it starts on CUDA."""
    _MOST_SPLITS[0] = max_splits
    _ACTIVE.clear()
    if attention_kernel != "auto":
        use_kernel(attention_kernel)


def use_kernel(name: str) -> AttentionKernel:
    """Pick a kernel by name ("kernels" or "own"), for tests and benchmarks comparing them."""
    chosen = KERNELS[name]()
    if chosen is None:
        raise ValueError(f"attention kernel {name!r} is not available")
    _ACTIVE[:] = [chosen]
    return chosen


def cuda_paged_attention(q: Tensor, kv: Tensor, pool: Tensor, meta: CudaAttentionMetadata) -> Tensor:
    """q [T, H, D], kv [T, 2, KVH, D] of the new tokens; `pool` one layer's [2, num_slots, KVH, D]."""
    pool.index_copy_(1, meta.slot_mapping, kv.transpose(0, 1))
    return kernel()(q, pool, meta)


def attend(q: Tensor, pool: Tensor, meta: CudaAttentionMetadata) -> Tensor:
    """Attention of q [T, H, D] over the pool, whose new K/V are already written (fused_triton)."""
    return kernel()(q, pool, meta)
