"""The client's completion-token request: one rule for every reader (engine, rate limits, cascades, wires)."""

from typing import Any


def requested_completion_field(body: dict[str, Any]) -> str:
    """The field the request's completion length is read from: `max_completion_tokens` or, where that is unset
    or 0, the legacy `max_tokens` (OpenAI's rule: the newer field wins). For error messages naming it."""
    return "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"


def requested_completion_tokens(body: dict[str, Any]) -> Any:
    """The value of `requested_completion_field` as sent (None when neither is set); callers supply their own
    default."""
    return body.get(requested_completion_field(body))
