"""The client's completion-token request: one rule for every reader (engine, rate limits, cascades, wires)."""

from typing import Any


def requested_completion_tokens(body: dict[str, Any]) -> Any:
    """`max_completion_tokens` or, where that is unset or 0, the legacy `max_tokens` (OpenAI's rule: the newer
    field wins). The value as sent (None when neither is set); callers supply their own default."""
    return body.get("max_completion_tokens") or body.get("max_tokens")
