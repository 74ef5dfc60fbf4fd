"""A step's attention inputs for the Triton kernels, built once per step and shared by every layer.

`build_kernel_metadata` takes the same spans as attention.build_metadata (per sequence: block table,
tokens already cached, new tokens, in flat-batch order) and returns flat int32 tensors. For CUDA graphs,
`pad_to` fixes the shapes: extra sequences get q_len 0 / context 0 (the kernels skip them) and block
tables are padded to `max_blocks` columns; copy a fresh step's tensors into the graph's static ones with
`KernelMetadata.copy_into`. Built on the host (a few small tensors), moved with one copy each.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from backends.local_engine.kernels.triton.paged_attention import paged_attention, paged_decode, write_kv


@dataclass
class KernelMetadata:
    block_tables: Tensor  # [S, max_blocks] int32, padded with block 0
    context_lens: Tensor  # [S] int32: cached + new tokens of each sequence
    query_start_loc: Tensor  # [S + 1] int32: sequence s owns q rows [qsl[s], qsl[s + 1])
    slot_mapping: Tensor  # [T] int64: pool slot of each new token's K/V
    block_size: int
    max_query_len: int  # host-side; 1 selects the decode kernel

    def copy_into(self, static: "KernelMetadata") -> None:
        """Copy into same-shaped static tensors (a captured CUDA graph's inputs)."""
        for name in ("block_tables", "context_lens", "query_start_loc", "slot_mapping"):
            getattr(static, name).copy_(getattr(self, name), non_blocking=True)


def build_kernel_metadata(
    spans: list[tuple[list[int], int, int]], block_size: int, device: torch.device,
    pad_to: tuple[int, int] | None = None, max_blocks: int | None = None, padding_slot: int | None = None,
) -> KernelMetadata:  # fmt: skip
    """`pad_to` = (num_seqs, num_tokens) of a CUDA-graph bucket. Padding sequences own no query rows
    (decode: their row's context is 0 and its output 0); padding tokens write their K/V to `padding_slot`,
    a slot no sequence owns (e.g. in one block kept back from the block manager): required with pad_to.
    Output rows of padding tokens are left unwritten (whatever `torch.empty` held)."""
    if pad_to is not None and padding_slot is None:
        raise ValueError("padding tokens need a padding_slot that no sequence owns")
    num_blocks = [len(table) for table, _, _ in spans]
    width = max_blocks if max_blocks is not None else max(num_blocks, default=1)
    num_seqs, num_tokens = pad_to if pad_to is not None else (len(spans), sum(n for _, _, n in spans))
    tables = torch.zeros(num_seqs, width, dtype=torch.int32)
    context_lens = torch.zeros(num_seqs, dtype=torch.int32)
    query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.int32)
    slot_mapping = torch.full((num_tokens,), padding_slot or 0, dtype=torch.int64)
    row = 0
    for seq, (table, computed, new) in enumerate(spans):
        tables[seq, : len(table)] = torch.tensor(table, dtype=torch.int32)
        context_lens[seq] = computed + new
        positions = torch.arange(computed, computed + new)
        blocks = tables[seq, positions // block_size].long()
        slot_mapping[row : row + new] = blocks * block_size + positions % block_size
        row += new
        query_start_loc[seq + 1] = row
    query_start_loc[len(spans) + 1 :] = row
    max_query_len = max((n for _, _, n in spans), default=1)
    return KernelMetadata(
        tables.to(device), context_lens.to(device), query_start_loc.to(device), slot_mapping.to(device),
        block_size, max_query_len,
    )  # fmt: skip


def kernel_attention(
    q: Tensor, kv: Tensor, pool: Tensor, meta: KernelMetadata, scale: float, window: int = 0,
    num_splits: int = 1,
) -> Tensor:  # fmt: skip
    """Drop-in for attention.paged_attention: q [T, H, D], kv [T, 2, KVH, D] of the new tokens → [T, H, D].

    Writes kv to the pool, then one kernel launch (decode kernel when every sequence brings one token).
    """
    write_kv(pool, kv, meta.slot_mapping)
    if meta.max_query_len == 1 and q.shape[0] == meta.context_lens.shape[0]:
        return paged_decode(q, pool, meta.block_tables, meta.block_size, meta.context_lens, scale, window,
                            num_splits=num_splits)  # fmt: skip
    return paged_attention(
        q, pool, meta.block_tables, meta.block_size, meta.context_lens, meta.query_start_loc, scale, window,
        num_splits=num_splits,
    )  # fmt: skip
