"""The token reservation made at admission, without a tokenizer.

prompt ≈ ceil(characters / 4) + 4 per chat message (role and framing); token-id prompts count one
token per id. completion = max_completion_tokens or max_tokens, else the policy's default, else the
process default; times `n`. Embeddings reserve the prompt only. Settlement replaces the estimate
with the real usage, so the estimate only decides admission near the limit.
"""

import math
from typing import Any

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


def prompt_tokens(endpoint: str, body: dict[str, Any]) -> int:
    if endpoint == "chat":
        messages = body.get("messages") or []
        return sum(_tokens(m.get("content")) + TOKENS_PER_MESSAGE for m in messages if isinstance(m, dict))
    return _tokens(body.get("input" if endpoint == "embeddings" else "prompt"))


def completion_tokens(endpoint: str, body: dict[str, Any], default: int) -> int:
    if endpoint == "embeddings":
        return 0
    asked = body.get("max_completion_tokens") or body.get("max_tokens") or default
    return int(asked) * max(1, int(body.get("n") or 1))


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
