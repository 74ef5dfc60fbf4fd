"""Prefix affinity: chained hashes of the prompt in fixed blocks, and which replica saw which blocks.

Like vLLM's prefix cache, block i's hash covers blocks 0..i, so a match on block i means the whole
prefix up to it matches. A replica that served a prompt is assumed to hold its blocks in its KV cache.
"""

import hashlib
from collections import OrderedDict
from typing import Any


def render_prompt(endpoint: str, body: dict[str, Any]) -> str:
    """The text that decides the KV-cache prefix: the messages in order, or the completion prompt."""
    if endpoint == "chat":
        return "".join(
            f"<|{m.get('role', '')}|>{_content_text(m.get('content'))}\n" for m in body.get("messages", [])
        )
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else str(prompt)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def block_hashes(text: str, block_chars: int) -> list[bytes]:
    """One chained hash per complete block; a trailing partial block is not cacheable, as in vLLM."""
    hashes: list[bytes] = []
    previous = b""
    for start in range(0, len(text) - block_chars + 1, block_chars):
        block = text[start : start + block_chars].encode()
        previous = hashlib.blake2b(previous + block, digest_size=12).digest()
        hashes.append(previous)
    return hashes


class PrefixIndex:
    """Per replica, the most recently sent block hashes (bounded, least recently used dropped first). A replica
    whose KV cache size is known remembers no more blocks than that cache holds (`record`'s `capacity`): an
    engine evicts least recently used blocks too, and a larger index would credit it with prefixes it no
    longer has."""

    def __init__(self, entries_per_replica: int) -> None:
        self._limit = entries_per_replica
        self._seen: dict[str, OrderedDict[bytes, None]] = {}

    def match(self, replica: str, hashes: list[bytes]) -> int:
        """How many leading blocks of the prompt this replica has seen."""
        seen = self._seen.get(replica)
        if not seen:
            return 0
        for length in range(len(hashes), 0, -1):
            if hashes[length - 1] in seen:
                return length
        return 0

    def record(self, replica: str, hashes: list[bytes], capacity: int | None = None) -> None:
        """`hashes` were just sent to `replica`; `capacity`: the blocks its KV cache holds, if known."""
        seen = self._seen.setdefault(replica, OrderedDict())
        for digest in reversed(hashes):  # the prompt's first block most recent: a tail is dropped first, as
            seen[digest] = None  # vLLM frees a finished request's blocks tail first
            seen.move_to_end(digest)
        limit = self._limit if capacity is None else max(min(self._limit, capacity), 1)
        while len(seen) > limit:
            seen.popitem(last=False)
