"""Gemma 3 hyper-parameters from GGUF metadata (those llama.cpp does not store take Gemma 3's defaults)."""

from dataclasses import dataclass, replace
from typing import Any

from backends.local_engine.model.model_config import ModelConfig

ARCHITECTURE = "gemma3"


@dataclass(frozen=True)
class Gemma3Config(ModelConfig):
    """ModelConfig plus what Gemma 3 adds. Layer i is global when (i + 1) % sliding_pattern == 0, else it
    attends to the last `sliding_window` positions only and uses the local RoPE base."""

    sliding_window: int = 512
    sliding_pattern: int = 6
    rope_local_theta: float = 10_000.0
    query_pre_attn_scalar: float = 256.0

    def is_sliding(self, layer: int) -> bool:
        return (layer + 1) % self.sliding_pattern != 0

    def local_rope(self) -> ModelConfig:
        """The config whose RoPE tables the sliding layers use (no scaling, the local base)."""
        return replace(self, rope_theta=self.rope_local_theta, rope_scaling={})


def gemma3_config(meta: dict[str, Any]) -> Gemma3Config:
    arch = ARCHITECTURE
    head_dim = int(meta[f"{arch}.attention.key_length"])
    scaling = meta.get(f"{arch}.rope.scaling.factor")
    return Gemma3Config(
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        hidden_size=int(meta[f"{arch}.embedding_length"]),
        intermediate_size=int(meta[f"{arch}.feed_forward_length"]),
        num_layers=int(meta[f"{arch}.block_count"]),
        num_heads=int(meta[f"{arch}.attention.head_count"]),
        num_kv_heads=int(meta[f"{arch}.attention.head_count_kv"]),
        head_dim=head_dim,
        rms_norm_eps=float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 1_000_000.0)),
        rope_scaling={"rope_type": "linear", "factor": float(scaling)} if scaling else {},
        max_position_embeddings=int(meta.get(f"{arch}.context_length", 32768)),
        tie_word_embeddings=True,
        sliding_window=int(meta.get(f"{arch}.attention.sliding_window", 512)),
        query_pre_attn_scalar=float(head_dim),  # llama.cpp's choice for every size but 27B
    )
