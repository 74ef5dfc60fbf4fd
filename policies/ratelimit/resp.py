"""Lua calls to Redis over raw RESP connections: the rate limiter's hot path without redis-py's overhead.

Measured (bench/README.md, "Gateway overhead"): redis-py's asyncio client spent several hundred µs of CPU per
script call on this box; a pooled asyncio protocol with hiredis's C parser needs a fraction of that.
Failures raise redis-py's exception types, so callers (the failover limiter) treat both clients alike.
"""

import asyncio
import hashlib
from collections import deque
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.exceptions import ConnectionError, ResponseError


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self._reader = hiredis.Reader(replyError=ResponseError)
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while self._waiting and (reply := self._reader.gets()) is not False:
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(ConnectionError("Redis closed the connection"))

    def send(self, command: bytes) -> "asyncio.Future[Any]":
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self.transport.write(command)
        return future


def _expire(reply: "asyncio.Future[Any]") -> None:
    if not reply.done():
        reply.set_exception(TimeoutError("Redis did not answer in time"))


def encode(*parts: str | bytes | int | float) -> bytes:
    items = [p if isinstance(p, bytes) else str(p).encode() for p in parts]
    return b"".join([b"*%d\r\n" % len(items), *(b"$%d\r\n%s\r\n" % (len(i), i) for i in items)])


class RespPool:
    """A few keep-alive connections to one Redis; one command in flight per connection."""

    def __init__(self, host: str, port: int, *, db: int = 0, password: str | None = None,
                 timeout_s: float = 5.0, max_connections: int = 64) -> None:  # fmt: skip
        self._address = (host, port)
        self._setup = ([encode("AUTH", password)] if password else []) + (
            [encode("SELECT", db)] if db else []
        )
        self._timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)

    @classmethod
    def like(cls, redis: Redis, max_connections: int = 64) -> "RespPool":
        """A pool to the same server, database and credentials as a redis-py client."""
        kwargs = redis.connection_pool.connection_kwargs
        timeout = kwargs.get("socket_timeout") or 5.0
        return cls(kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379), db=kwargs.get("db", 0),
                   password=kwargs.get("password"), timeout_s=timeout, max_connections=max_connections)  # fmt: skip

    async def call(self, *parts: str | bytes | int | float) -> Any:
        async with self._slots:
            conn = await self._connection()
            try:
                reply = await self._within_timeout(conn.send(encode(*parts)))
            except BaseException:
                conn.transport.close()
                raise
            self._idle.append(conn)
            return reply

    async def _within_timeout(self, reply: "asyncio.Future[Any]") -> Any:
        timer = asyncio.get_running_loop().call_later(self._timeout_s, _expire, reply)
        try:
            return await reply
        finally:
            timer.cancel()

    async def _connection(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        try:
            _, conn = await asyncio.wait_for(
                asyncio.get_running_loop().create_connection(_Connection, *self._address), self._timeout_s
            )
        except (TimeoutError, OSError) as exc:
            raise ConnectionError(
                f"cannot connect to Redis at {self._address[0]}:{self._address[1]}"
            ) from exc
        for command in self._setup:
            await self._within_timeout(conn.send(command))
        return conn

    def close(self) -> None:
        for conn in self._idle:
            conn.transport.close()
        self._idle.clear()


class LuaScript:
    """EVALSHA, falling back to EVAL once when the server does not know the script yet."""

    def __init__(self, pool: RespPool, source: str) -> None:
        self._pool = pool
        self._source = source
        self._sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self._pool.call("EVALSHA", self._sha, len(keys), *keys, *args)
        except ResponseError as error:
            if not str(error).startswith("NOSCRIPT"):
                raise
            return await self._pool.call("EVAL", self._source, len(keys), *keys, *args)
