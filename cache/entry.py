"""One cached answer and what is needed to find it again, plus its byte form for Redis."""

import time
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import orjson

from cache.encoder import EncodedQuestion

_IN_MEMORY = frozenset({"vector", "encoded"})  # not in the JSON metadata


@dataclass
class CacheEntry:
    key: str  # the exact key; also the entry's id in stores and indexes
    tenant: str
    model: str
    endpoint: str
    answer: dict[str, Any]  # the non-streaming OpenAI response body
    expires_at: float  # time.time() seconds
    cost_usd: float = 0.0  # what the answer cost upstream (saved on every hit)
    namespace: str | None = None  # semantic namespace; None = exact lookups only
    question: str | None = None  # the last user turn, read by the verifier
    vector: np.ndarray | None = field(default=None, repr=False)  # normalised float32 embedding
    encoded: EncodedQuestion | None = field(default=None, repr=False)  # word vectors; this replica only

    def expired(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) >= self.expires_at

    def usage(self) -> dict[str, Any]:
        return self.answer.get("usage") or {}

    def meta_bytes(self) -> bytes:
        return orjson.dumps({f.name: getattr(self, f.name) for f in fields(self) if f.name not in _IN_MEMORY})

    def vector_bytes(self) -> bytes:
        return b"" if self.vector is None else np.asarray(self.vector, dtype=np.float32).tobytes()

    @classmethod
    def from_bytes(cls, meta: bytes, vector: bytes | None) -> "CacheEntry":
        entry = cls(**orjson.loads(meta))
        entry.vector = np.frombuffer(vector, dtype=np.float32).copy() if vector else None
        return entry
