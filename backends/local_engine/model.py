"""Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU) over a flat batch of tokens with a paged KV cache.

q/k/v and gate/up projections are fused into one matmul each at load time (see weights.py).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backends.local_engine.attention import AttentionMetadata, paged_attention
from backends.local_engine.kv_cache import KVCache
from backends.local_engine.model_config import ModelConfig
from backends.local_engine.rope import RotaryTable, apply_rotary


class DecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, norms: tuple[Tensor, Tensor], qkv: nn.Module, o_proj: nn.Module,
        gate_up: nn.Module, down: nn.Module,
    ) -> None:  # fmt: skip
        super().__init__()
        self.input_norm = nn.Parameter(norms[0], requires_grad=False)
        self.post_norm = nn.Parameter(norms[1], requires_grad=False)
        self.qkv, self.o_proj, self.gate_up, self.down = qkv, o_proj, gate_up, down
        self.eps = config.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.intermediate = config.intermediate_size

    def forward(
        self, hidden: Tensor, residual: Tensor, rotary: tuple[Tensor, Tensor], meta: AttentionMetadata,
        kv: tuple[Tensor, Tensor],
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        residual = residual + hidden
        hidden = self._attention(
            F.rms_norm(residual, residual.shape[-1:], self.input_norm, self.eps), rotary, meta, kv
        )
        residual = residual + hidden
        gate, up = self.gate_up(F.rms_norm(residual, residual.shape[-1:], self.post_norm, self.eps)).chunk(
            2, -1
        )
        return self.down(F.silu(gate) * up), residual

    def _attention(
        self, x: Tensor, rotary: tuple[Tensor, Tensor], meta: AttentionMetadata, kv: tuple[Tensor, Tensor]
    ) -> Tensor:
        qkv = self.qkv(x).view(x.shape[0], self.heads + 2 * self.kv_heads, self.head_dim)
        qk = apply_rotary(qkv[:, : self.heads + self.kv_heads], *rotary)
        q, k, v = qk[:, : self.heads], qk[:, self.heads :], qkv[:, self.heads + self.kv_heads :]
        out = paged_attention(q, k, v, kv[0], kv[1], meta)
        return self.o_proj(out.reshape(x.shape[0], self.heads * self.head_dim))


class Embedding(nn.Module):
    """Token embedding stored dense, or int8 per row (quantized formats) and dequantized on lookup."""

    def __init__(self, weight: Tensor, scale: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.dtype = dtype

    def forward(self, ids: Tensor) -> Tensor:
        rows = self.weight[ids].to(self.dtype)
        return rows if self.scale is None else rows * self.scale[ids, None].to(self.dtype)


class LlamaModel(nn.Module):
    def __init__(
        self, config: ModelConfig, embed: Embedding, layers: list[DecoderLayer], norm: Tensor,
        lm_head: nn.Module, max_positions: int,
    ) -> None:  # fmt: skip
        super().__init__()
        self.config = config
        self.embed, self.layers, self.lm_head = embed, nn.ModuleList(layers), lm_head
        self.norm = nn.Parameter(norm, requires_grad=False)
        self.rotary = RotaryTable(config, max_positions, embed.dtype, norm.device)

    @torch.inference_mode()
    def forward(
        self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata, kv_cache: KVCache
    ) -> Tensor:
        """Final hidden states [T, hidden] of the flat batch; K/V of every token is written to the pool."""
        hidden = self.embed(input_ids)
        residual = torch.zeros_like(hidden)
        rotary = self.rotary.lookup(positions)
        for layer, kv in zip(self.layers, kv_cache.layers, strict=True):
            hidden, residual = layer(hidden, residual, rotary, meta, kv)
        return F.rms_norm(residual + hidden, hidden.shape[-1:], self.norm, self.config.rms_norm_eps)

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden).float()
