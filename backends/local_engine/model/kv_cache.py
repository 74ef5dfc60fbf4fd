"""The paged KV pool: per layer one pre-allocated tensor of `num_blocks * block_size` token slots.

Slot `block_id * block_size + offset` holds one token's keys (or values) for all KV heads. Sequences own
blocks through their block table (handed out by the block manager); the runner writes new tokens' K/V to
their slots (slot mapping) and attention gathers a sequence's context through its block table.
"""

import torch
from torch import Tensor

from backends.local_engine.model.model_config import ModelConfig


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V that one token occupies across all layers."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.kv_size * element_size


def num_blocks_for_memory(memory_mb: int, block_size: int, bytes_per_token: int) -> int:
    return max(1, memory_mb * 1024 * 1024 // (block_size * bytes_per_token))


class KVCache:
    def __init__(
        self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (config.num_layers, 2, num_blocks * block_size, config.num_kv_heads, config.head_dim)
        self.pool = torch.zeros(shape, dtype=dtype, device=device)
        self.layers: list[Tensor] = list(self.pool)  # per layer [2, num_slots, kv_heads, head_dim]

    @property
    def nbytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()

    def block_view(self, layer: int) -> Tensor:
        """[2, num_blocks, block_size, kv_heads, head_dim] view of one layer (for tests and debugging)."""
        return self.pool[layer].view(2, self.num_blocks, self.block_size, *self.pool.shape[-2:])


def slots_for(block_table: Tensor, start: int, end: int, block_size: int) -> Tensor:
    """Slot indices of token positions [start, end) of a sequence whose blocks are `block_table`."""
    positions = torch.arange(start, end, device=block_table.device)
    return block_table[positions // block_size] * block_size + positions % block_size


def block_slots(tables: list[list[int]], lengths: list[int], block_size: int, device: torch.device) -> Tensor:
    """[batch, max(lengths)] slot indices of positions 0.. of each sequence, built with a few batched ops.

    Positions past a sequence's own length point at arbitrary valid slots (callers mask them).
    """
    num_blocks = -(-max(lengths) // block_size)
    rows = [table[:num_blocks] + [0] * (num_blocks - len(table[:num_blocks])) for table in tables]
    offsets = torch.arange(block_size, device=device)
    blocks = torch.tensor(rows, dtype=torch.long, device=device)
    return (blocks[:, :, None] * block_size + offsets).flatten(1)[:, : max(lengths)]
