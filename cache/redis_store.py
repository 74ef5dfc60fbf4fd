"""Entries in Redis, shared by a fleet. Every change is also appended to a Redis stream, which each
replica follows to keep its own FAISS index in step (after loading all live entries at start).

Layout under the prefix P:
  P:e:<key>        hash {meta, vec}, expires with the entry (PEXPIREAT)
  P:t:<tenant#>    sorted set of the tenant's keys scored by expiry: size limit and flush by tenant
  P:tenants        set of tenant hashes (flush of every tenant)
  P:events         stream of {op: add|del|flush, data: json}
"""

import asyncio
import contextlib
import hashlib
import logging
import time
from typing import Any

import orjson
from redis.asyncio import Redis

from cache.entry import CacheEntry
from cache.store import IndexListener, NoListener

log = logging.getLogger("llmgw.cache")
_BATCH = 500


class RedisStore:
    def __init__(self, redis: Redis, prefix: str, stream_maxlen: int = 100_000) -> None:
        self._redis = redis
        self._prefix = prefix
        self._events = f"{prefix}:events"
        self._maxlen = stream_maxlen
        self._listener: IndexListener = NoListener()
        self._follower: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self, listener: IndexListener | None) -> None:
        """Load every live entry into the listener, then follow the event stream from that moment."""
        self._listener = listener if listener is not None else NoListener()
        if listener is None:
            return
        try:
            last_id = await self._load()
        except Exception as exc:  # Redis away at start-up: serve (misses) now, load the index when it returns
            log.warning("cache: Redis unreachable at start-up (%s); loading the index once it answers", exc)
            self._follower = asyncio.create_task(self._load_then_follow(), name="cache-redis-follower")
            return
        self._follower = asyncio.create_task(self._follow(last_id), name="cache-redis-follower")

    async def _load(self) -> str:
        """Every live entry into the listener; the id of the last event before them."""
        last_id = await self._last_event_id()
        await self._load_all()
        return last_id

    async def _load_then_follow(self) -> None:
        while not self._closed:
            try:
                last_id = await self._load()
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(1.0)
                continue
            return await self._follow(last_id)

    async def get(self, key: str) -> CacheEntry | None:
        meta, vector = await self._redis.hmget(self._entry(key), ["meta", "vec"])
        if meta is None:
            return None
        entry = CacheEntry.from_bytes(meta, vector)
        return None if entry.expired() else entry

    async def put(self, entry: CacheEntry, max_entries: int) -> None:
        tenant_set = self._tenant(entry.tenant)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                self._entry(entry.key), mapping={"meta": entry.meta_bytes(), "vec": entry.vector_bytes()}
            )
            pipe.pexpireat(self._entry(entry.key), int(entry.expires_at * 1000))
            pipe.zadd(tenant_set, {entry.key: entry.expires_at})
            pipe.zremrangebyscore(tenant_set, "-inf", time.time())
            pipe.sadd(f"{self._prefix}:tenants", _hash(entry.tenant))
            self._publish(pipe, "add", {"key": entry.key, "expires_at": entry.expires_at})
            pipe.zcard(tenant_set)
            *_, size = await pipe.execute()
        self._listener.on_added(entry)
        if size > max_entries:
            await self._evict(tenant_set, size - max_entries)

    async def delete(self, key: str) -> None:
        await self._remove([key])

    async def flush(self, tenant: str | None, model: str | None) -> int:
        tenant_sets = [self._tenant(tenant)] if tenant is not None else await self._all_tenant_sets()
        removed = 0
        for tenant_set in tenant_sets:
            keys = [k.decode() for k in await self._redis.zrange(tenant_set, 0, -1)]
            doomed = keys if model is None else await self._of_model(keys, model)
            removed += await self._delete_keys(tenant_set, doomed)
        await self._redis.xadd(
            self._events, _event("flush", {"tenant": tenant, "model": model}), maxlen=self._maxlen
        )
        self._listener.on_flushed(tenant, model)
        return removed

    async def sweep(self) -> int:
        return 0  # Redis expires entries itself; each replica's index sweeps its own vectors

    async def aclose(self) -> None:
        self._closed = True
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower

    # --- writes -------------------------------------------------------------------------------

    async def _evict(self, tenant_set: str, count: int) -> None:
        oldest = await self._redis.zpopmin(tenant_set, count)
        await self._remove([member.decode() for member, _ in oldest])

    async def _remove(self, keys: list[str]) -> None:
        if not keys:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(*(self._entry(k) for k in keys))
            self._publish(pipe, "del", {"keys": keys})
            await pipe.execute()
        self._listener.on_removed(keys)

    async def _delete_keys(self, tenant_set: str, keys: list[str]) -> int:
        removed = 0
        for start in range(0, len(keys), _BATCH):
            batch = keys[start : start + _BATCH]
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(*(self._entry(k) for k in batch))
                pipe.zrem(tenant_set, *batch)
                deleted, _ = await pipe.execute()
            removed += deleted
        return removed

    def _publish(self, pipe: Any, op: str, data: dict[str, Any]) -> None:
        pipe.xadd(self._events, _event(op, data), maxlen=self._maxlen, approximate=True)

    # --- reads --------------------------------------------------------------------------------

    async def _of_model(self, keys: list[str], model: str) -> list[str]:
        entries = await self._fetch(keys)
        return [e.key for e in entries if e.model == model]

    async def _all_tenant_sets(self) -> list[str]:
        return [self._tenant_hash(h.decode()) for h in await self._redis.smembers(f"{self._prefix}:tenants")]

    async def _fetch(self, keys: list[str]) -> list[CacheEntry]:
        entries: list[CacheEntry] = []
        for start in range(0, len(keys), _BATCH):
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys[start : start + _BATCH]:
                    pipe.hmget(self._entry(key), ["meta", "vec"])
                rows = await pipe.execute()
            entries += [CacheEntry.from_bytes(meta, vec) for meta, vec in rows if meta is not None]
        return entries

    async def _load_all(self) -> None:
        keys: list[str] = []
        async for name in self._redis.scan_iter(match=f"{self._prefix}:e:*", count=1000):
            keys.append(name.decode().rsplit(":", 1)[1])
        for entry in await self._fetch(keys):
            if not entry.expired():
                self._listener.on_added(entry)
        log.info("cache: loaded %d entries from Redis", len(keys))

    async def _last_event_id(self) -> str:
        last = await self._redis.xrevrange(self._events, count=1)
        return last[0][0].decode() if last else "0-0"

    # --- following ----------------------------------------------------------------------------

    async def _follow(self, last_id: str) -> None:
        while not self._closed:
            try:
                last_id = await self._follow_once(last_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                if self._closed:
                    return
                log.exception("cache: following Redis events failed; retrying")
                await asyncio.sleep(1.0)

    async def _follow_once(self, last_id: str) -> str:
        reply = await self._redis.xread({self._events: last_id}, count=_BATCH, block=1000)
        for _, events in reply or ():
            for event_id, fields in events:
                await self._apply(fields[b"op"].decode(), orjson.loads(fields[b"data"]))
                last_id = event_id.decode()
        return last_id

    async def _apply(self, op: str, data: dict[str, Any]) -> None:
        if op == "add" and not self._listener.holds(data["key"], data["expires_at"]):
            for entry in await self._fetch([data["key"]]):
                self._listener.on_added(entry)
        elif op == "del":
            self._listener.on_removed(data["keys"])
        elif op == "flush":
            self._listener.on_flushed(data["tenant"], data["model"])

    # --- names --------------------------------------------------------------------------------

    def _entry(self, key: str) -> str:
        return f"{self._prefix}:e:{key}"

    def _tenant(self, tenant: str) -> str:
        return self._tenant_hash(_hash(tenant))

    def _tenant_hash(self, tenant_hash: str) -> str:
        return f"{self._prefix}:t:{tenant_hash}"


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:24]


def _event(op: str, data: dict[str, Any]) -> dict[str, bytes]:
    return {"op": op.encode(), "data": orjson.dumps(data)}
