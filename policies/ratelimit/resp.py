"""Lua calls to Redis over one pipelined RESP connection: the rate limiter's hot path without redis-py.

Commands issued in the same event-loop turn leave in one write, and replies come back in order, so under
load many admissions and settlements share each round trip. Measured in bench/README.md ("Policies and
rate limits", "Gateway overhead"). Failures raise redis-py's exception types, so callers (the failover
limiter) treat both clients alike.
"""

import asyncio
import hashlib
from collections import deque
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


def encode(*parts: str | bytes | int | float) -> bytes:
    items = [p if isinstance(p, bytes) else str(p).encode() for p in parts]
    return b"".join([b"*%d\r\n" % len(items), *(b"$%d\r\n%s\r\n" % (len(i), i) for i in items)])


class _Connection(asyncio.Protocol):
    """Many commands in flight; replies resolve their futures in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._reader = hiredis.Reader(replyError=ResponseError)
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._outgoing: list[bytes] = []
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
                future.set_exception(ConnectionError("the connection to Redis was lost"))

    def send(self, command: bytes) -> "asyncio.Future[Any]":
        future = self._loop.create_future()
        self._waiting.append(future)
        if not self._outgoing:
            self._loop.call_soon(self._flush)
        self._outgoing.append(command)
        return future

    def _flush(self) -> None:
        if not self.closed:
            self.transport.write(b"".join(self._outgoing))
        self._outgoing.clear()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class RespPool:
    """One pipelined connection to one Redis, reopened when it breaks."""

    def __init__(self, host: str, port: int, *, db: int = 0, password: str | None = None,
                 timeout_s: float = 5.0) -> None:  # fmt: skip
        self._address = (host, port)
        self._setup = ([encode("AUTH", password)] if password else []) + (
            [encode("SELECT", db)] if db else []
        )
        self._timeout_s = timeout_s
        self._connection: _Connection | None = None
        self._connecting = asyncio.Lock()

    @classmethod
    def like(cls, redis: Redis) -> "RespPool":
        """A pool to the same server, database and credentials as a redis-py client."""
        kwargs = redis.connection_pool.connection_kwargs
        return cls(kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379), db=kwargs.get("db", 0),
                   password=kwargs.get("password"), timeout_s=kwargs.get("socket_timeout") or 5.0)  # fmt: skip

    async def call(self, *parts: str | bytes | int | float) -> Any:
        conn = await self._connected()
        try:
            return await self._within_timeout(conn, conn.send(encode(*parts)))
        except asyncio.CancelledError:
            conn.close()  # its replies would no longer line up with their callers
            raise

    async def _within_timeout(self, conn: _Connection, reply: "asyncio.Future[Any]") -> Any:
        timer = asyncio.get_running_loop().call_later(self._timeout_s, _expire, conn, reply)
        try:
            return await reply
        finally:
            timer.cancel()

    async def _connected(self) -> _Connection:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        async with self._connecting:
            if self._connection is None or self._connection.closed:
                self._connection = await self._connect()
            return self._connection

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), *self._address), self._timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise ConnectionError(
                f"cannot connect to Redis at {self._address[0]}:{self._address[1]}"
            ) from exc
        for command in self._setup:
            await self._within_timeout(conn, conn.send(command))
        return conn

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


def _expire(conn: _Connection, reply: "asyncio.Future[Any]") -> None:
    """A reply that never came: drop the connection (later replies would be misattributed)."""
    if not reply.done():
        reply.set_exception(RedisTimeoutError("Redis did not answer in time"))
        conn.close()


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
