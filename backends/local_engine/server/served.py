"""What the engine server serves: the model's public face (ServedModel) and, once loaded, the engine with it."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backends.local_engine.engine.async_engine import AsyncEngine
from backends.local_engine.server.metrics import EngineMetrics


@dataclass
class ServedModel:
    """What the server needs besides the engine: the public name and the tokenizer's three jobs."""

    name: str
    encode_text: Callable[[str], list[int]]
    encode_chat: Callable[..., list[int]]  # (messages, **template options) -> ids: prompts.chat_ids
    token_text: Callable[[int], str]
    grammars: Any = None  # structured.Grammars: JSON response formats by constrained decoding; None = refused
    vocab_size: int | None = None  # token ids a logit_bias may name; None = not checked
    decode: Callable[[list[int]], str] | None = None  # ids -> text, special tokens kept (/detokenize)
    root: str | None = None  # the model as the server was given it (the model card's root; None: the name)


@dataclass
class LoadedEngine:
    engine: AsyncEngine
    model: ServedModel
    metrics: EngineMetrics
