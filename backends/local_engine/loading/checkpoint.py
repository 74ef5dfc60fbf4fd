"""What a loader hands to the model: the architecture, HF-named float tensors and the tokenizer source."""

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from backends.local_engine.model.model_config import ModelConfig


@dataclass
class TokenizerSource:
    """Either a tokenizer.json path (HF folder) or the GGUF metadata fields (vocab, merges, ids)."""

    tokenizer_json: Path | None = None
    gguf_fields: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()


@dataclass
class Checkpoint:
    config: ModelConfig
    tensors: Iterator[tuple[str, torch.Tensor]]  # lazily produced, HF parameter names, float32
    num_tensors: int
    tokenizer: TokenizerSource
    name: str
