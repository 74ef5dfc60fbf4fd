"""Token usage, as OpenAI reports it."""

import math
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_openai(cls, usage: dict[str, Any] | None) -> "Usage":
        if not usage:
            return cls()
        details = usage.get("prompt_tokens_details") or {}
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
        )


def estimate_prompt_tokens(endpoint: str, body: dict[str, Any]) -> int:
    """A request's prompt tokens without a tokenizer: ceil(characters / 4) + 4 per chat message (role and
    framing); token-id prompts count one token per id. For admission (rate limits) and for a stream cut short
    before the upstream reported its usage."""
    if endpoint == "chat":
        messages = body.get("messages") or []
        return sum(_tokens(m.get("content")) + TOKENS_PER_MESSAGE for m in messages if isinstance(m, dict))
    return _tokens(body.get("input" if endpoint == "embeddings" else "prompt"))


def _tokens(value: Any) -> int:
    return math.ceil(_chars(value) / CHARS_PER_TOKEN)


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, int):
        return CHARS_PER_TOKEN  # a token id
    if isinstance(value, list):
        return sum(_chars(item) for item in value)
    if isinstance(value, dict):
        return _chars(value.get("text"))
    return 0
