"""Stored responses (`store: true`), for previous_response_id and GET/DELETE: in-process, or in Redis.

Like the cache (cache/store.py, cache/redis_store.py): one protocol, an in-process store for a single
replica and a Redis store a fleet shares. Each record belongs to the tenant that created it.
"""

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import orjson
from redis.asyncio import Redis

from gateway.responses_api.config import ResponsesSettings


@dataclass
class StoredResponse:
    tenant: str
    response: dict[str, Any]  # the Response object as returned
    history: list[dict[str, Any]]  # the conversation up to and including this answer, as chat messages
    input_items: list[dict[str, Any]]  # this request's input items (GET .../input_items)


class ResponseStore(Protocol):
    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def put(self, record: StoredResponse) -> None: ...

    async def delete(self, response_id: str) -> bool: ...

    async def aclose(self) -> None: ...


class MemoryResponseStore:
    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._records: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()

    async def get(self, response_id: str) -> StoredResponse | None:
        found = self._records.get(response_id)
        if found is None or found[0] <= time.monotonic():
            self._records.pop(response_id, None)
            return None
        return found[1]

    async def put(self, record: StoredResponse) -> None:
        self._records[record.response["id"]] = (time.monotonic() + self._ttl, record)
        while len(self._records) > self._max:
            self._records.popitem(last=False)

    async def delete(self, response_id: str) -> bool:
        return self._records.pop(response_id, None) is not None

    async def aclose(self) -> None:
        self._records.clear()


class RedisResponseStore:
    def __init__(self, redis: Redis, prefix: str, ttl_s: int) -> None:
        self._redis = redis
        self._prefix = prefix
        self._ttl = ttl_s

    async def get(self, response_id: str) -> StoredResponse | None:
        raw = await self._redis.get(self._key(response_id))
        return StoredResponse(**orjson.loads(raw)) if raw else None

    async def put(self, record: StoredResponse) -> None:
        await self._redis.set(self._key(record.response["id"]), orjson.dumps(asdict(record)), ex=self._ttl)

    async def delete(self, response_id: str) -> bool:
        return bool(await self._redis.delete(self._key(response_id)))

    async def aclose(self) -> None:
        await self._redis.aclose()

    def _key(self, response_id: str) -> str:
        return f"{self._prefix}:{response_id}"


def create_response_store(
    settings: ResponsesSettings, redis_url: str | None, connect: Callable[[], Redis] | None = None
) -> ResponseStore:
    """`connect`: the gateway's Redis client maker (TLS options, ACL user, Sentinel); else the URL alone."""
    if settings.store == "redis" or (settings.store == "auto" and redis_url):
        if not redis_url:
            raise ValueError("responses.store is 'redis' but redis_url is not set")
        client = connect() if connect is not None else Redis.from_url(redis_url)
        return RedisResponseStore(client, settings.key_prefix, settings.ttl_s)
    return MemoryResponseStore(settings.ttl_s, settings.max_entries)
