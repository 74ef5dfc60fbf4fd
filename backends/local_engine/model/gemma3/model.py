"""Gemma 3 decoder over a flat batch of tokens with the engine's paged KV cache.

Differences from the Llama family (backends/local_engine/model/llama.py): embeddings scaled by sqrt(hidden);
RMSNorm weights are (1 + w) (the GGUF already stores 1 + w, as llama.cpp's converter adds the 1); four
norms per layer (before and after attention and MLP); RMSNorm on each query and key head (QK-norm);
GeGLU MLP (tanh-approximated GELU); attention scaled by query_pre_attn_scalar; sliding-window layers
with their own RoPE base, interleaved with global layers (every `sliding_pattern`-th).
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backends.local_engine.model.attention import AttentionMetadata, paged_attention
from backends.local_engine.model.gemma3.config import Gemma3Config
from backends.local_engine.model.gemma3.window import windowed
from backends.local_engine.model.kv_cache import KVCache
from backends.local_engine.model.llama import Embedding, LlamaModel
from backends.local_engine.model.rope import RotaryTable, rotate_

NORMS = ("input", "post_attention", "pre_feedforward", "post_feedforward", "q", "k")


class Gemma3Layer(nn.Module):
    def __init__(
        self, config: Gemma3Config, norms: dict[str, Tensor], qkv: nn.Module, o_proj: nn.Module,
        gate_up: nn.Module, down: nn.Module, sliding: bool,
    ) -> None:  # fmt: skip
        super().__init__()
        self.norms = nn.ParameterDict({k: nn.Parameter(norms[k], requires_grad=False) for k in NORMS})
        self.qkv, self.o_proj, self.gate_up, self.down = qkv, o_proj, gate_up, down
        self.eps, self.sliding = config.rms_norm_eps, sliding
        self.heads, self.kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        # SDPA scales by head_dim ** -0.5; Gemma by query_pre_attn_scalar ** -0.5
        self.q_scale = math.sqrt(config.head_dim / config.query_pre_attn_scalar)

    def forward(
        self, residual: Tensor, rotations: Tensor, meta: AttentionMetadata, kv_pool: Tensor
    ) -> Tensor:
        attended = self._attention(self._norm(residual, "input"), rotations, meta, kv_pool)
        residual = residual + self._norm(attended, "post_attention")
        gate, up = self.gate_up(self._norm(residual, "pre_feedforward")).chunk(2, -1)
        mlp = self.down(F.gelu(gate, approximate="tanh") * up)
        return residual + self._norm(mlp, "post_feedforward")

    def _norm(self, x: Tensor, name: str) -> Tensor:
        weight = self.norms[name]
        return F.rms_norm(x, weight.shape, weight, self.eps)

    def _attention(self, x: Tensor, rotations: Tensor, meta: AttentionMetadata, kv_pool: Tensor) -> Tensor:
        tokens, heads, kv_heads = x.shape[0], self.heads, self.kv_heads
        qkv = self.qkv(x).view(tokens, heads + 2 * kv_heads, self.head_dim)
        q = self._norm(qkv[:, :heads], "q")
        k = self._norm(qkv[:, heads : heads + kv_heads], "k")
        rotate_(q, rotations)
        rotate_(k, rotations)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        kv = torch.stack([k, qkv[:, heads + kv_heads :]], dim=1)
        out = paged_attention(q, kv, kv_pool, meta)
        return self.o_proj(out.reshape(tokens, heads * self.head_dim))


class Gemma3Model(LlamaModel):
    """LlamaModel's interface and parts (self.rotary: the global layers' RoPE) plus the local RoPE table."""

    def __init__(
        self, config: Gemma3Config, embed: Embedding, layers: list[Gemma3Layer], norm: Tensor,
        lm_head: nn.Module, max_positions: int,
    ) -> None:  # fmt: skip
        super().__init__(config, embed, layers, norm, lm_head, max_positions)  # type: ignore[arg-type]
        self.gemma = config
        self.local_rotary = RotaryTable(config.local_rope(), max_positions, norm.device)
        self.embed_scale = math.sqrt(config.hidden_size)

    @torch.inference_mode()
    def forward(
        self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata, kv_cache: KVCache
    ) -> Tensor:
        residual = self.embed(input_ids) * self.embed_scale
        local, global_ = self.local_rotary.lookup(positions), self.rotary.lookup(positions)
        window_meta = windowed(meta, self.gemma.sliding_window)
        for layer, kv_pool in zip(self.layers, kv_cache.layers, strict=True):
            if layer.sliding:
                residual = layer(residual, local, window_meta, kv_pool)
            else:
                residual = layer(residual, global_, meta, kv_pool)
        return F.rms_norm(residual, self.norm.shape, self.norm, self.config.rms_norm_eps)
