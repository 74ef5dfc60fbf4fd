"""CPU int4 steps through every decoder layer in one C++ call.

Why hand-written (issue 14): at batch 1 on the CPU the model's own work is small (SmolLM2-135M int4: ~2.6 ms
of matmuls a token with kernels/cpu/ops.py's kernel) and PyTorch's per-op cost is not: ~60 ATen ops a layer at 2-5 µs
each, RMSNorm alone six ops, plus SDPA's setup (~100 µs a call on an AVX2 EPYC) — 20 of the 22 ms of a
batch-1 step there (studies/README.md, "int4 on AVX2 CPUs"). cpu_decode.cpp runs the whole layer stack as plain
loops: RMSNorm, the int4 matmuls (int4_cpu.cpp), RoPE, the K/V write into the paged pool, attention over each
row's block table, SiLU, residual adds. The embedding, the final norm and the output layer stay in Python.

Taken for every step when every layer's four projections run kernels/cpu/ops.py's kernel (`CpuDecoder.build`).
Attention converts each row chunk's context to float32 once per KV head and scores 8 keys per FMA chain.
Every row goes through the same arithmetic whatever the step holds (per-row activation scales in the
matmuls, a fixed order in attention, whatever the span's length or chunking), so a decode row, a speculative
verification row and a prefill row of the same token give the same logits, bit for bit: speculative
decoding keeps greedy output unchanged, and so do chunk boundaries.
The engine setting cpu_fused_decode=False turns it off.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from backends.local_engine.kernels.cpu import ops as cpu_kernels
from backends.local_engine.model.kv_cache import KVCache
from backends.local_engine.model.llama import LlamaModel


class CpuDecoder:
    def __init__(self, model: LlamaModel, kv_cache: KVCache, block_size: int) -> None:
        self.model, self.pool, self.block_size = model, kv_cache.pool, block_size
        layers = list(model.layers)
        self.norms = [norm.float() for layer in layers for norm in (layer.input_norm, layer.post_norm)]
        self.linears = [
            buffer
            for layer in layers
            for linear in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)
            for buffer in (linear.codes, linear.scales)
        ]
        self.qkv_bias = [layer.qkv.bias for layer in layers] if layers[0].qkv.bias is not None else []
        self.rotations = torch.view_as_real(model.rotary.rotations).contiguous()  # [positions, D/2, 2]
        self.heads, self.eps = model.config.num_heads, model.config.rms_norm_eps

    @classmethod
    def build(cls, model: torch.nn.Module, kv_cache: KVCache, block_size: int) -> "CpuDecoder | None":
        """A decoder when the model can take this path here, else None (the caller asks only when the
        engine setting cpu_fused_decode is on)."""
        if type(model) is not LlamaModel:
            return None
        if kv_cache.pool.is_cuda or kv_cache.pool.dtype not in (torch.bfloat16, torch.float32):
            return None
        linears = [m for layer in model.layers for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
        if not all(isinstance(m, cpu_kernels.Int4CpuLinear) for m in linears):
            return None
        others = [m for layer in model.layers for m in (layer.o_proj, layer.gate_up, layer.down)]
        if (
            model.config.head_dim % 8
            or model.config.head_dim > 256
            or any(m.bias is not None for m in others)
        ):
            return None  # biases: on q/k/v only (Qwen2)
        return cls(model, kv_cache, block_size)

    @torch.inference_mode()
    def forward(
        self, input_ids: list[int], positions: list[int], spans: list[tuple[list[int], int, int]]
    ) -> Tensor:
        """Final hidden states [T, hidden] (normed) of a step of short spans; K/V written to the pool."""
        max_blocks = max(len(table) for table, _, _ in spans)
        tables, lens, slots = [], [], []
        for table, start, count in spans:
            padded = table + [0] * (max_blocks - len(table))
            for position in range(start, start + count):
                tables.append(padded)
                lens.append(position + 1)
                slots.append(
                    table[position // self.block_size] * self.block_size + position % self.block_size
                )
        residual = self.model.embed(torch.tensor(input_ids)).float().contiguous()
        residual = cpu_kernels.decode_layers(
            residual, self.norms, self.linears, self.qkv_bias, self.pool, self.rotations[positions],
            torch.tensor(slots), torch.tensor(tables), torch.tensor(lens), torch.tensor([n for _, _, n in spans]),
            self.heads, self.block_size, self.eps,
        )  # fmt: skip
        return F.rms_norm(residual, self.model.norm.shape, self.model.norm, self.eps)
