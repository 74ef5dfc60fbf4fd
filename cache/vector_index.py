"""This replica's FAISS view of the semantic entries: one index per namespace, inner product on
normalised vectors (= cosine). Follows the store through the IndexListener calls."""

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import faiss
import numpy as np

from cache.encoder import EncodedQuestion
from cache.entry import CacheEntry


@dataclass
class IndexedItem:
    key: str
    tenant: str
    model: str
    namespace: str
    question: str
    expires_at: float
    encoded: EncodedQuestion | None = field(default=None, repr=False)  # for the verifier; filled lazily


@dataclass(frozen=True)
class Neighbour:
    similarity: float
    item: IndexedItem


class _Namespace:
    """Vectors of one namespace. HNSW cannot delete, so removed ids are tombstoned and skipped;
    the index is rebuilt from its own vectors when tombstones outnumber live ones."""

    def __init__(self, dim: int, kind: str, hnsw_m: int, ef_search: int) -> None:
        self._make = lambda: _new_index(dim, kind, hnsw_m, ef_search)
        self.index = self._make()
        self.tombstones: set[int] = set()
        self._hnsw = kind == "hnsw"

    @property
    def live(self) -> int:
        return self.index.ntotal - len(self.tombstones)

    def add(self, item_id: int, vector: np.ndarray) -> None:
        self.index.add_with_ids(vector.reshape(1, -1), np.array([item_id], dtype=np.int64))

    def remove(self, ids: list[int]) -> None:
        if not self._hnsw:
            self.index.remove_ids(np.array(ids, dtype=np.int64))
            return
        self.tombstones.update(ids)
        if len(self.tombstones) > max(64, self.live):
            self._rebuild()

    def search(self, vector: np.ndarray, k: int) -> list[tuple[float, int]]:
        found, ids = self.index.search(
            vector.reshape(1, -1), min(k + len(self.tombstones), self.index.ntotal)
        )
        pairs = [(float(s), int(i)) for s, i in zip(found[0], ids[0], strict=True) if i >= 0]
        return [p for p in pairs if p[1] not in self.tombstones][:k]

    def _rebuild(self) -> None:
        keep = np.array([i for i in _ids(self.index) if i not in self.tombstones], dtype=np.int64)
        vectors = np.vstack([self.index.reconstruct(int(i)) for i in keep]) if len(keep) else None
        self.index, self.tombstones = self._make(), set()
        if vectors is not None:
            self.index.add_with_ids(vectors, keep)


class SemanticIndex:
    """Namespaces → FAISS indexes, plus what each vector stands for. Implements IndexListener."""

    def __init__(self, dim: int, kind: str = "flat", hnsw_m: int = 32, ef_search: int = 64) -> None:
        self._dim, self._kind, self._m, self._ef = dim, kind, hnsw_m, ef_search
        self._spaces: dict[str, _Namespace] = {}
        self._items: dict[int, IndexedItem] = {}
        self._id_of: dict[str, int] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._items)

    def holds(self, key: str, expires_at: float) -> bool:
        item_id = self._id_of.get(key)
        return item_id is not None and self._items[item_id].expires_at == expires_at

    def search(self, namespace: str, vector: np.ndarray, k: int, threshold: float) -> list[Neighbour]:
        """Live neighbours at or above the threshold, most similar first."""
        space = self._spaces.get(namespace)
        if space is None or space.live == 0:
            return []
        now = time.time()
        found = [Neighbour(s, self._items[i]) for s, i in space.search(vector, k) if i in self._items]
        return [n for n in found if n.similarity >= threshold and n.item.expires_at > now]

    def on_added(self, entry: CacheEntry) -> None:
        if entry.namespace is None or entry.vector is None or entry.question is None:
            return
        if self.holds(entry.key, entry.expires_at):
            return
        if entry.key in self._id_of:
            self.on_removed([entry.key])
        item_id, self._next_id = self._next_id, self._next_id + 1
        self._items[item_id] = IndexedItem(
            entry.key,
            entry.tenant,
            entry.model,
            entry.namespace,
            entry.question,
            entry.expires_at,
            entry.encoded,
        )
        self._id_of[entry.key] = item_id
        self._space(entry.namespace).add(item_id, np.asarray(entry.vector, dtype=np.float32))

    def on_removed(self, keys: Iterable[str]) -> None:
        by_space: dict[str, list[int]] = {}
        for key in keys:
            item_id = self._id_of.pop(key, None)
            if item_id is not None:
                by_space.setdefault(self._items.pop(item_id).namespace, []).append(item_id)
        for namespace, ids in by_space.items():
            self._spaces[namespace].remove(ids)
            if self._spaces[namespace].live == 0:
                del self._spaces[namespace]

    def on_flushed(self, tenant: str | None, model: str | None) -> None:
        self.on_removed(
            [
                item.key
                for item in self._items.values()
                if (tenant is None or item.tenant == tenant) and (model is None or item.model == model)
            ]
        )

    def sweep(self, now: float | None = None) -> int:
        now = now if now is not None else time.time()
        expired = [item.key for item in self._items.values() if item.expires_at <= now]
        self.on_removed(expired)
        return len(expired)

    def _space(self, namespace: str) -> _Namespace:
        if namespace not in self._spaces:
            self._spaces[namespace] = _Namespace(self._dim, self._kind, self._m, self._ef)
        return self._spaces[namespace]


def _new_index(dim: int, kind: str, hnsw_m: int, ef_search: int) -> faiss.Index:
    if kind == "flat":
        return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    hnsw = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efSearch = ef_search
    return faiss.IndexIDMap2(hnsw)


def _ids(index: faiss.Index) -> np.ndarray:
    return faiss.vector_to_array(index.id_map)
