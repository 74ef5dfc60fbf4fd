"""Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU) over a flat batch of tokens with a paged KV cache.

q/k/v and gate/up projections are fused into one matmul each at load time (see weights.py).
On CUDA (steps carrying attention_cuda metadata) the layers run `fused_forward`: residual add + RMSNorm,
RoPE + K/V write and SwiGLU are one Triton kernel each (kernels/triton/fused.py). One-token steps whose
projections all run the Triton GEMV (bf16, int8) take `gemv_forward` instead: six kernels a layer, the
norms, SwiGLU and residual adds inside the GEMVs (8B batch-1 graph 4.54 → 4.32 ms on the H200,
studies/README.md). With the engine setting int4_fused, steps of up to 64 tokens whose projections are all int4_mma
layers take `int4_forward`: six kernels a layer in the same way (int4_mma.cu's fused forms; correct on the
H200 but slower there, 2.66 against 2.45 ms an 8B step, so off by default). The CPU path is unchanged.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backends.local_engine.model.attention import AttentionMetadata, paged_attention
from backends.local_engine.model.kv_cache import KVCache
from backends.local_engine.model.model_config import ModelConfig
from backends.local_engine.model.rope import RotaryTable, rotate_


class DecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, norms: tuple[Tensor, Tensor], qkv: nn.Module, o_proj: nn.Module,
        gate_up: nn.Module, down: nn.Module, mlp_dtype: torch.dtype | None = None,
    ) -> None:  # fmt: skip
        """`mlp_dtype`: the MLP runs in this dtype between its two matmuls (bf16 for CPU int4, whose kernel
        takes and returns bf16: one conversion per MLP instead of four); None: the residual stream's."""
        super().__init__()
        self.input_norm = nn.Parameter(norms[0], requires_grad=False)
        self.post_norm = nn.Parameter(norms[1], requires_grad=False)
        self.qkv, self.o_proj, self.gate_up, self.down = qkv, o_proj, gate_up, down
        self.mlp_dtype = mlp_dtype
        self.eps = config.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim

    def forward(
        self, residual: Tensor, rotations: Tensor, meta: AttentionMetadata, kv_pool: Tensor
    ) -> Tensor:
        """Pre-norm block: residual stream in, residual stream out."""
        residual = residual + self._attention(self._norm(residual, self.input_norm), rotations, meta, kv_pool)
        normed = self._norm(residual, self.post_norm)
        gate, up = self.gate_up(normed if self.mlp_dtype is None else normed.to(self.mlp_dtype)).chunk(2, -1)
        return residual + self.down(F.silu(gate) * up)  # a bf16 MLP output is added in float32

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        return F.rms_norm(x, weight.shape, weight, self.eps)

    def _attention(self, x: Tensor, rotations: Tensor, meta: AttentionMetadata, kv_pool: Tensor) -> Tensor:
        qkv = self.qkv(x).view(x.shape[0], self.heads + 2 * self.kv_heads, self.head_dim)
        rotate_(qkv[:, : self.heads + self.kv_heads], rotations)
        kv = qkv[:, self.heads :].view(x.shape[0], 2, self.kv_heads, self.head_dim)
        out = paged_attention(qkv[:, : self.heads], kv, kv_pool, meta)
        return self.o_proj(out.reshape(x.shape[0], self.heads * self.head_dim))

    def fused_forward(
        self, normed: Tensor, residual: Tensor, positions: Tensor, rotations: Tensor, meta, kv_pool: Tensor,
        next_norm: Tensor,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """CUDA: (this layer's output normed by `next_norm`, the residual stream) from the normed input."""
        from backends.local_engine.kernels.triton.fused import add_rms_norm, rope_write_kv, silu_mul
        from backends.local_engine.model.attention_cuda import attend  # triton loads only on CUDA

        tokens = normed.shape[0]
        qkv = self.qkv(normed)
        rope_write_kv(qkv, positions, rotations, meta.slot_mapping, kv_pool, self.heads, self.kv_heads)
        q = qkv.view(tokens, self.heads + 2 * self.kv_heads, self.head_dim)[:, : self.heads]
        attention = self.o_proj(attend(q, kv_pool, meta).reshape(tokens, self.heads * self.head_dim))
        normed, residual = add_rms_norm(attention, residual, self.post_norm, self.eps)
        mlp = self.down(silu_mul(self.gate_up(normed)))
        return add_rms_norm(mlp, residual, next_norm, self.eps)

    def gemv_operands(self) -> list[tuple] | None:
        """The four projections' (weight, scale, bias) when all run gemv_triton's kernel, else None."""
        linears = (self.qkv, self.o_proj, self.gate_up, self.down)
        found = [getattr(m, "gemv_operands", lambda: None)() for m in linears]
        return None if any(item is None for item in found) else found

    def gemv_forward(
        self, residual: Tensor, positions: Tensor, rotations: Tensor, meta, kv_pool: Tensor, operands: list[tuple],
    ) -> Tensor:  # fmt: skip
        """CUDA, one token: the residual stream in and out in six kernels. RMSNorms run inside the GEMVs
        that read them, residual adds and SwiGLU in the GEMVs that produce them (kernels/triton/gemv.py)."""
        from backends.local_engine.kernels.triton.fused import rope_write_kv
        from backends.local_engine.kernels.triton.gemv import gemv
        from backends.local_engine.model.attention_cuda import attend

        (qkv_w, qkv_s, qkv_b), (o_w, o_s, o_b), (gu_w, gu_s, _), (down_w, down_s, _) = operands
        qkv = gemv(residual, qkv_w, qkv_s, bias=qkv_b, norm=self.input_norm, eps=self.eps)
        rope_write_kv(qkv, positions, rotations, meta.slot_mapping, kv_pool, self.heads, self.kv_heads)
        q = qkv.view(1, self.heads + 2 * self.kv_heads, self.head_dim)[:, : self.heads]
        attention = attend(q, kv_pool, meta).reshape(1, self.heads * self.head_dim)
        residual = gemv(attention, o_w, o_s, bias=o_b, residual=residual)
        mlp = gemv(residual, gu_w, gu_s, norm=self.post_norm, eps=self.eps, swiglu=True)
        return gemv(mlp, down_w, down_s, residual=residual)

    def int4_ready(self) -> bool:
        """Whether `int4_forward` can run this layer: bias-free int4_mma projections, gate/up interleaved."""
        from backends.local_engine.kernels.cuda.int4_mma import STORE_GATE_UP, Int4MmaLinear

        linears = (self.qkv, self.o_proj, self.gate_up, self.down)
        return (
            all(isinstance(m, Int4MmaLinear) and m.bias is None for m in linears)
            and self.gate_up.mode == STORE_GATE_UP
            and self.input_norm.dtype == self.post_norm.dtype == torch.bfloat16
        )

    def int4_forward(
        self, residual: Tensor, positions: Tensor, rotations: Tensor, meta, kv_pool: Tensor
    ) -> Tensor:
        """CUDA, int4_mma layers: the bf16 residual stream in and out in six kernels, as `gemv_forward`."""
        from backends.local_engine.kernels.triton.fused import rope_write_kv
        from backends.local_engine.model.attention_cuda import attend

        tokens = residual.shape[0]
        qkv = self.qkv.fused(residual, norm=self.input_norm, eps=self.eps)
        rope_write_kv(qkv, positions, rotations, meta.slot_mapping, kv_pool, self.heads, self.kv_heads)
        q = qkv.view(tokens, self.heads + 2 * self.kv_heads, self.head_dim)[:, : self.heads]
        attention = attend(q, kv_pool, meta).reshape(tokens, self.heads * self.head_dim)
        residual = self.o_proj.fused(attention, residual=residual)
        mlp = self.gate_up.fused(residual, norm=self.post_norm, eps=self.eps, swiglu=True)
        return self.down.fused(mlp, residual=residual)


INT4_FUSED_MAX_TOKENS = 64  # one weight pass of int4_mma


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
        self.rotary = RotaryTable(config, max_positions, norm.device)

    @torch.inference_mode()
    def forward(
        self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata, kv_cache: KVCache
    ) -> Tensor:
        """Final hidden states [T, hidden] of the flat batch; K/V of every token is written to the pool."""
        if not isinstance(meta, AttentionMetadata):
            return self._fused_forward(input_ids, positions, meta, kv_cache)
        residual = self.embed(input_ids)
        rotations = self.rotary.lookup(positions)
        for layer, kv_pool in zip(self.layers, kv_cache.layers, strict=True):
            residual = layer(residual, rotations, meta, kv_pool)
        return F.rms_norm(residual, self.norm.shape, self.norm, self.config.rms_norm_eps)

    def _fused_forward(self, input_ids: Tensor, positions: Tensor, meta, kv_cache: KVCache) -> Tensor:
        from backends.local_engine.kernels.triton.fused import add_rms_norm

        eps = self.config.rms_norm_eps
        layers = list(self.layers)
        if input_ids.shape[0] <= INT4_FUSED_MAX_TOKENS and self._int4_fused():
            residual = self.embed(input_ids)
            for layer, kv_pool in zip(layers, kv_cache.layers, strict=True):
                residual = layer.int4_forward(residual, positions, self.rotary.rotations, meta, kv_pool)
            return add_rms_norm(residual, None, self.norm, eps)[0]
        operands = self._gemv_operands() if input_ids.shape[0] == 1 else None
        if operands is not None:
            residual = self.embed(input_ids)
            for layer, kv_pool, ops in zip(layers, kv_cache.layers, operands, strict=True):
                residual = layer.gemv_forward(residual, positions, self.rotary.rotations, meta, kv_pool, ops)
            return add_rms_norm(residual, None, self.norm, eps)[0]
        normed, residual = add_rms_norm(self.embed(input_ids), None, layers[0].input_norm, eps)
        norms = [layer.input_norm for layer in layers[1:]] + [self.norm]
        rotations = self.rotary.rotations
        for layer, kv_pool, next_norm in zip(layers, kv_cache.layers, norms, strict=True):
            normed, residual = layer.fused_forward(
                normed, residual, positions, rotations, meta, kv_pool, next_norm
            )
        return normed

    def _gemv_operands(self) -> list[list[tuple]] | None:
        """Per layer, the operands of the fused batch-1 path (None when a layer cannot take it). Looked up
        once: the weights do not move after load. The unfused batch-1 step (8B graph 4.54 against 4.32 ms on
        the H200, studies/README.md) is no longer a choice: the LLMGW_FUSED_GEMV switch is gone."""
        if not hasattr(self, "_gemv_cache"):
            found = [layer.gemv_operands() for layer in self.layers]
            self._gemv_cache = found if all(found) else None
        return self._gemv_cache

    def _int4_fused(self) -> bool:
        """Whether short steps take `int4_forward`: every layer can, which only layers built with the engine
        setting int4_fused can (gate/up interleaved); looked up once."""
        if not hasattr(self, "_int4_fused_cache"):
            self._int4_fused_cache = all(layer.int4_ready() for layer in self.layers)
        return self._int4_fused_cache

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden).float()
