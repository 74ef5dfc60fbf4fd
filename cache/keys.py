"""Canonical forms of a request: the exact-cache key and the semantic namespace + question.

Fields that cannot change the answer (streaming, usage reporting, end-user labels) are dropped; all
others, including unknown ones, are kept, so a new upstream parameter can only cause misses, never
wrong hits. Numbers are normalised (0 == 0.0) and JSON keys sorted, so spelling does not matter.
"""

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

IGNORED_FIELDS = frozenset({"stream", "stream_options", "user", "metadata", "store", "service_tier", "cache"})
_LAST_TURN = "<last user turn>"


@dataclass(frozen=True)
class SemanticParts:
    namespace: str  # tenant + model + everything but the last user turn
    question: str  # the last user turn's text


def canonical_body(body: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in body.items() if k not in IGNORED_FIELDS and k != "model"}
    if "messages" in kept:
        kept["messages"] = [_canonical_message(m) for m in kept["messages"]]
    return _normalise(kept)


def exact_key(tenant: str, model: str, endpoint: str, body: dict[str, Any]) -> str:
    return _digest(tenant, model, endpoint, canonical_body(body))


def semantic_parts(tenant: str, model: str, endpoint: str, body: dict[str, Any]) -> SemanticParts | None:
    """None when the request has no plain-text final question to compare."""
    canonical = canonical_body(body)
    if endpoint == "chat":
        question = _take_last_user_turn(canonical)
    elif endpoint == "completions" and isinstance(canonical.get("prompt"), str):
        question, canonical["prompt"] = canonical["prompt"], _LAST_TURN
    else:
        question = None
    if not question or not question.strip():
        return None
    return SemanticParts(_digest(tenant, model, endpoint, canonical), question.strip())


def is_deterministic(body: dict[str, Any]) -> bool:
    return body.get("temperature") == 0 or isinstance(body.get("seed"), int)


def _take_last_user_turn(canonical: dict[str, Any]) -> str | None:
    messages = canonical.get("messages") or []
    if not messages or messages[-1].get("role") != "user" or set(messages[-1]) - {"role", "content"}:
        return None
    content = messages[-1].get("content")
    if not isinstance(content, str):
        return None
    messages[-1] = {"role": "user", "content": _LAST_TURN}
    return content


def _canonical_message(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list) and len(content) == 1 and _is_text_part(content[0]):
        message = {**message, "content": content[0]["text"]}
    return message


def _is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and set(part) == {"type", "text"}


def _normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:  # larger: JSON writers refuse
        return int(value)
    return value


def _digest(tenant: str, model: str, endpoint: str, canonical: dict[str, Any]) -> str:
    payload = orjson.dumps([tenant, model, endpoint, canonical], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(payload).hexdigest()
