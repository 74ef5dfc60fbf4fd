"""The token reservation made at admission, without a tokenizer.

prompt: core.usage.estimate_prompt_tokens (≈ ceil(characters / 4) + 4 per chat message; one token per id).
completion = max_completion_tokens or max_tokens (core.completion), else the policy's reserve_completion_tokens,
else the process's (PoliciesSettings); times `n`. Embeddings reserve the prompt only. Settlement replaces the
estimate with the real usage, so the estimate only decides admission near the limit.
"""

from typing import Any

from core.completion import requested_completion_tokens
from core.usage import estimate_prompt_tokens as prompt_tokens

__all__ = ["completion_tokens", "prompt_tokens"]


def completion_tokens(endpoint: str, body: dict[str, Any], default: int) -> int:
    if endpoint == "embeddings":
        return 0
    asked = requested_completion_tokens(body) or default
    return int(asked) * max(1, int(body.get("n") or 1))
