"""Assemble a LlamaModel from a Checkpoint's tensor stream: fuse q/k/v and gate/up, convert to the format.

fp32 on CUDA keeps them as separate matmuls in the checkpoint's shapes (quant.ConcatLinear says why).

Layers are built as soon as all their tensors have arrived, so peak memory stays near one layer of float32
on top of the converted model. A tqdm bar shows progress.
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm import tqdm

from backends.local_engine.config import KernelSettings
from backends.local_engine.kernels.quant import ConcatLinear
from backends.local_engine.kernels.quantize import quantize_int8
from backends.local_engine.kernels.select import cpu_int4_kernel, cpu_int8_kernel, dense_linear, make_linear
from backends.local_engine.loading.checkpoint import Checkpoint
from backends.local_engine.model.llama import DecoderLayer, Embedding, LlamaModel
from backends.local_engine.model.model_config import ModelConfig
from backends.local_engine.model.rope import interleave_rope_rows

_LAYER_WEIGHTS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
_QKV_BIASES = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")


@dataclass(frozen=True)
class WeightFormat:
    dtype: str = "fp32"  # fp32 | bf16 | fp16 | int8 | int4
    int4_group_size: int = 32
    cuda: bool = False  # on CUDA the quantized formats compute in bf16 (their kernels' activation dtype)
    kernels: KernelSettings = field(default_factory=KernelSettings)  # which kernel each layer runs

    @property
    def activation_dtype(self) -> torch.dtype:
        bf16 = self.dtype == "bf16" or (self.cuda and self.dtype in ("int8", "int4"))
        return torch.bfloat16 if bf16 else torch.float32


def required_layer_names(config: ModelConfig) -> tuple[str, ...]:
    return _LAYER_WEIGHTS + (_QKV_BIASES if config.attention_bias else ())


class ModelBuilder:
    def __init__(self, config: ModelConfig, fmt: WeightFormat, device: torch.device) -> None:
        self.config, self.fmt, self.device = config, fmt, device
        self.pending: dict[int, dict[str, Tensor]] = {}
        self.layers: dict[int, DecoderLayer] = {}
        self.globals: dict[str, Tensor] = {}

    def add(self, name: str, tensor: Tensor) -> None:
        if not name.startswith("model.layers."):
            self.globals[name] = tensor.to(self.device)
            return
        index_text, local_name = name.removeprefix("model.layers.").split(".", 1)
        layer = self.pending.setdefault(int(index_text), {})
        layer[local_name] = tensor.to(self.device)
        if all(key in layer for key in required_layer_names(self.config)):
            self.layers[int(index_text)] = self._layer(self.pending.pop(int(index_text)))

    def _linear(self, weight: Tensor, bias: Tensor | None = None, gate_up: bool = False) -> torch.nn.Module:
        fmt = self.fmt
        return make_linear(weight, bias, fmt.dtype, fmt.int4_group_size, gate_up=gate_up, kernels=fmt.kernels)

    def _stacked(
        self, weights: list[Tensor], biases: list[Tensor] | None = None, gate_up: bool = False
    ) -> torch.nn.Module:
        """One matmul over the stacked weights; fp32 on CUDA: one per weight (quant.ConcatLinear)."""
        if self.fmt.dtype == "fp32" and self.fmt.cuda:
            return ConcatLinear(weights, biases)
        return self._linear(torch.cat(weights), None if biases is None else torch.cat(biases), gate_up)

    def _qkv_parts(self, t: dict[str, Tensor], kind: str) -> list[Tensor]:
        """q, k, v; q and k rows in the adjacent-pair order RoPE uses (rope.interleave_rope_rows)."""
        q, k, v = (t[f"self_attn.{p}_proj.{kind}"] for p in "qkv")
        head_dim = self.config.head_dim
        return [interleave_rope_rows(q, head_dim), interleave_rope_rows(k, head_dim), v]

    def _layer(self, t: dict[str, Tensor]) -> DecoderLayer:
        qkv_bias = self._qkv_parts(t, "bias") if self.config.attention_bias else None
        norms = tuple(t[n].to(self.fmt.activation_dtype) for n in _LAYER_WEIGHTS[:2])
        return DecoderLayer(
            self.config,
            norms,
            qkv=self._stacked(self._qkv_parts(t, "weight"), qkv_bias),
            o_proj=self._linear(t["self_attn.o_proj.weight"]),
            gate_up=self._stacked([t["mlp.gate_proj.weight"], t["mlp.up_proj.weight"]], gate_up=True),
            down=self._linear(t["mlp.down_proj.weight"]),
            mlp_dtype=self._mlp_dtype(t["mlp.down_proj.weight"]),
        )

    def _mlp_dtype(self, down: Tensor) -> torch.dtype | None:
        """bf16 between the MLP's matmuls for torch's CPU int4 kernel (bf16 in and out), else None (the
        residual stream's dtype; kernels/cpu/ops.py's kernel takes float32)."""
        if self.fmt.dtype != "int4" or (
            not self.fmt.cuda and cpu_int4_kernel(*down.shape, self.fmt.int4_group_size, self.fmt.kernels)
        ):
            return None
        return torch.bfloat16

    def finish(self, max_positions: int) -> LlamaModel:
        missing = [i for i in range(self.config.num_layers) if i not in self.layers]
        if missing or "model.embed_tokens.weight" not in self.globals:
            raise ValueError(f"checkpoint is incomplete: layers {missing[:5]} or embeddings missing")
        embed = self._embedding(self.globals["model.embed_tokens.weight"])
        return LlamaModel(
            self.config,
            embed,
            [self.layers[i] for i in range(self.config.num_layers)],
            self.globals["model.norm.weight"].to(self.fmt.activation_dtype),
            self._lm_head(embed),
            max_positions,
        )

    def _embedding(self, weight: Tensor) -> Embedding:
        if self.fmt.dtype in ("int8", "int4"):
            return Embedding(*quantize_int8(weight), dtype=self.fmt.activation_dtype)
        if self.fmt.dtype == "fp16":
            return Embedding(weight.half(), None, torch.float32)
        return Embedding(weight.to(self.fmt.activation_dtype), None, self.fmt.activation_dtype)

    def _lm_head(self, embed: Embedding) -> torch.nn.Module:
        head_weight = self.globals.get("lm_head.weight")
        if head_weight is None and self.fmt.dtype in ("fp32", "bf16"):
            return dense_linear(embed.weight, None, self.fmt.kernels)  # tied: share the embedding's storage
        weight = self.globals["model.embed_tokens.weight"] if head_weight is None else head_weight
        # int4 keeps the output projection in int8, as llama.cpp's Q4 formats keep it at higher precision
        # (fp16 keeps its own: an int8 head is 0.7 ms faster at 1 row but costs fp16 its near-fp32 quality)
        dtype = "int8" if self.fmt.dtype == "int4" else self.fmt.dtype
        if (
            self.fmt.dtype == "int4"
            and not self.fmt.cuda
            and cpu_int8_kernel(*weight.shape, self.fmt.kernels)
        ):
            from backends.local_engine.kernels.cpu.ops import Int8CpuLinear

            return Int8CpuLinear(weight)  # the AVX2 kernel family: 3-4x fbgemm's int8 GEMM on such CPUs
        return make_linear(weight, None, dtype, self.fmt.int4_group_size, kernels=self.fmt.kernels)


def build_llama(
    checkpoint: Checkpoint, fmt: WeightFormat, device: torch.device, max_positions: int
) -> LlamaModel:
    """A Llama-family model (Llama, Qwen2, SmolLM2) from the checkpoint's tensor stream."""
    builder = ModelBuilder(checkpoint.config, fmt, device)
    tensors = tqdm(checkpoint.tensors, total=checkpoint.num_tensors, desc="Loading weights", unit="tensor")
    for name, tensor in tensors:
        builder.add(name, tensor)
    return builder.finish(max_positions)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes held by the model's weights, each storage counted once (tied embeddings share one).

    Weights prepacked by a kernel library (fbgemm) live outside tensors: modules report them as packed_nbytes.
    """
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.parameters()}
    storages |= {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.buffers()}
    packed = sum(getattr(module, "packed_nbytes", 0) for module in model.modules())
    return sum(storages.values()) + packed
