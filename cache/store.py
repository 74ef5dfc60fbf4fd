"""Where entries live, and the in-process store. Stores tell the semantic index what changed."""

import itertools
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

from cache.entry import CacheEntry


class IndexListener(Protocol):
    """Follows a store's changes (the semantic index of this replica)."""

    def on_added(self, entry: CacheEntry) -> None: ...

    def on_removed(self, keys: Iterable[str]) -> None: ...

    def on_flushed(self, tenant: str | None, model: str | None) -> None: ...

    def holds(self, key: str, expires_at: float) -> bool: ...


class CacheStore(Protocol):
    async def start(self, listener: IndexListener | None) -> None: ...

    async def get(self, key: str) -> CacheEntry | None: ...

    async def put(self, entry: CacheEntry, max_entries: int) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def flush(self, tenant: str | None, model: str | None) -> int: ...

    async def sweep(self) -> int: ...

    async def aclose(self) -> None: ...


class NoListener:
    def on_added(self, entry: CacheEntry) -> None:
        pass

    def on_removed(self, keys: Iterable[str]) -> None:
        pass

    def on_flushed(self, tenant: str | None, model: str | None) -> None:
        pass

    def holds(self, key: str, expires_at: float) -> bool:
        return False


class MemoryStore:
    """Entries in this process; least recently used go first when a tenant is over its limit."""

    def __init__(self) -> None:
        self._by_tenant: dict[str, OrderedDict[str, CacheEntry]] = {}
        self._tenant_of: dict[str, str] = {}
        self._listener: IndexListener = NoListener()

    async def start(self, listener: IndexListener | None) -> None:
        self._listener = listener if listener is not None else NoListener()

    async def get(self, key: str) -> CacheEntry | None:
        entries = self._by_tenant.get(self._tenant_of.get(key, ""))
        entry = entries.get(key) if entries is not None else None
        if entry is None:
            return None
        if entry.expired():
            self._remove([key])
            return None
        entries.move_to_end(key)
        return entry

    async def put(self, entry: CacheEntry, max_entries: int) -> None:
        entries = self._by_tenant.setdefault(entry.tenant, OrderedDict())
        entries[entry.key] = entry
        entries.move_to_end(entry.key)
        self._tenant_of[entry.key] = entry.tenant
        self._listener.on_added(entry)
        self._remove(list(itertools.islice(entries, max(0, len(entries) - max_entries))))

    async def delete(self, key: str) -> None:
        self._remove([key])

    async def flush(self, tenant: str | None, model: str | None) -> int:
        doomed = [e.key for e in self._all() if _matches(e, tenant, model)]
        self._remove(doomed, notify=False)
        self._listener.on_flushed(tenant, model)
        return len(doomed)

    async def sweep(self) -> int:
        now = time.time()
        expired = [e.key for e in self._all() if e.expired(now)]
        self._remove(expired)
        return len(expired)

    async def aclose(self) -> None:
        self._by_tenant.clear()
        self._tenant_of.clear()

    def __len__(self) -> int:
        return len(self._tenant_of)

    def _all(self) -> list[CacheEntry]:
        return [e for entries in self._by_tenant.values() for e in entries.values()]

    def _remove(self, keys: list[str], notify: bool = True) -> None:
        for key in keys:
            tenant = self._tenant_of.pop(key, None)
            if tenant is not None:
                self._by_tenant[tenant].pop(key, None)
        if keys and notify:
            self._listener.on_removed(keys)


def _matches(entry: CacheEntry, tenant: str | None, model: str | None) -> bool:
    return (tenant is None or entry.tenant == tenant) and (model is None or entry.model == model)
