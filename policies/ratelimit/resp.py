"""Lua calls to Redis over one pipelined RESP connection: the rate limiter's hot path without redis-py.

Hand-written because it measured cheaper: redis-py 8.1 (asyncio, hiredis parser) spends ~250-300 µs
more CPU per admission on this machine (bench/policies_ratelimit.py, "resp-handwritten" vs "redis-py"
rows; bench/README.md "Policies and rate limits"). Commands issued in the same event-loop turn leave in
one write and replies come back in order, so under load many admissions and settlements share each round
trip, and a settlement sent before an admission is applied before it.

Every call is bounded by `timeout_s` of silence from Redis, and by 10 × timeout_s while Redis keeps
answering the calls queued ahead of it (see _bounded). A lost connection is reopened in the background
(calls fail at once meanwhile, and the failover limiter answers them), so no call waits for a connect. Error replies are raised, never returned,
as redis-py's exception types (NoScriptError, OutOfMemoryError, ReadOnlyError, ...; BUSY, WRONGTYPE and
the rest as ResponseError), so callers (the failover limiter) classify them like any redis-py error.
"""

import asyncio
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import hiredis
from redis._parsers.base import BaseParser
from redis.exceptions import (
    ConnectionError,
    InvalidResponse,
    ReadOnlyError,
    RedisError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from policies.redis_connect import parse_redis_url

Resolver = Callable[[], Awaitable[tuple[str, int]]]


def encode(*parts: str | bytes | int | float) -> bytes:
    """One command in RESP, by hiredis's C encoder: the same bytes as str(part).encode() per part
    (tests/test_ratelimit_resp_encode.py), ~0.8 µs instead of ~2.5 µs in Python for an admission's EVALSHA."""
    return hiredis.pack_command(parts)


PROGRESS_CAP = 10  # a call's hard bound, in timeouts, while Redis keeps answering the calls ahead of it
CONNECT_TIMEOUTS = (
    20  # opening a connection and loading the scripts: 20 timeouts (at least 1 s), off the path
)
RECONNECT_EVERY_S = 0.2
SENTINEL_CHECK_S = 1.0  # Sentinel: how often the Sentinels are asked whether the master moved
# A `lazy` command (settlement) waits up to this long for an eager one (the next admission) to share its
# write and round trip; order on the connection is kept either way.
LAZY_FLUSH_S = 0.005


class _Connection(asyncio.Protocol):
    """Many commands in flight; replies resolve their futures in order."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_lost: Callable[[], None], close_on_readonly: bool = False
    ) -> None:
        self.loop = loop  # its own: asyncio.get_running_loop() makes a getpid() syscall on each call (3.11)
        self._on_lost = on_lost
        self._close_on_readonly = close_on_readonly  # Sentinel: a demoted master; reconnect to the new one
        self._reader = hiredis.Reader(replyError=_ErrorReply)
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._outgoing: list[bytes] = []
        self._flush_soon = False
        self._flush_later: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.last_data_at = 0.0  # loop time of the last bytes from Redis: is it making progress?

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_data_at = self.loop.time()
        self._reader.feed(data)
        while self._waiting:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:  # garbage on the wire: nothing after it can be trusted
                self._fail(InvalidResponse(f"invalid reply from Redis: {exc}"))
                return
            if reply is False:
                return
            future = self._waiting.popleft()
            if future.done():
                continue
            if isinstance(reply, _ErrorReply):
                error = BaseParser.parse_error(reply.message)
                future.set_exception(error)
                if self._close_on_readonly and isinstance(error, ReadOnlyError):
                    self._fail(error)
                    return
            else:
                future.set_result(reply)

    def _fail(self, error: RedisError) -> None:
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)
        self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        error = ConnectionError("the connection to Redis was lost" + (f" ({_reason(exc)})" if exc else ""))
        error.__cause__ = exc  # e.g. the server's TLS alert: no client certificate
        self._fail(error)
        self._on_lost()

    def send(self, command: bytes, lazy: bool = False) -> "asyncio.Future[Any]":
        future = self.loop.create_future()
        self._waiting.append(future)
        self._outgoing.append(command)
        if not lazy and not self._flush_soon:
            self._flush_soon = True
            self.loop.call_soon(self._flush)
        elif lazy and not self._flush_soon and self._flush_later is None:
            self._flush_later = self.loop.call_later(LAZY_FLUSH_S, self._flush)
        return future

    def _flush(self) -> None:
        self._flush_soon = False
        if self._flush_later is not None:
            self._flush_later.cancel()
            self._flush_later = None
        if self._outgoing and not self.closed:
            self.transport.write(b"".join(self._outgoing))
        self._outgoing.clear()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _ErrorReply:
    """What hiredis builds for an error reply; turned into the matching redis-py exception."""

    def __init__(self, message: str) -> None:
        self.message = message


class RespPool:
    """One pipelined connection to one Redis, reopened when it breaks. TLS when `tls` is given (checked
    against `server_hostname`, default the host); `username` for an ACL user; `resolve` names the address
    anew for each connection (Sentinel), and `role_check` makes sure it is a master."""

    def __init__(self, host: str, port: int, *, db: int = 0, password: str | None = None,
                 timeout_s: float = 5.0, username: str | None = None, tls: ssl.SSLContext | None = None,
                 server_hostname: str | None = None, resolve: Resolver | None = None,
                 role_check: bool = False) -> None:  # fmt: skip
        self._address = (host, port)
        auth = [encode("AUTH", username, password or "")] if username else []
        auth = auth or ([encode("AUTH", password)] if password else [])
        self._setup = auth + ([encode("SELECT", db)] if db else []) + ([encode("ROLE")] if role_check else [])
        self._role_check = role_check
        self._tls = tls
        self._server_hostname = server_hostname
        self._resolve = resolve
        self._timeout_s = timeout_s
        self._connect_timeout_s = max(1.0, CONNECT_TIMEOUTS * timeout_s)
        self._connection: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None
        self._ever_connected = False
        self._closed = False
        self._watching: asyncio.Task[None] | None = None
        self.lost_hook: Callable[[], None] | None = None  # the cluster's: a node gone, ask for the slot map
        self.problem: BaseException | None = None  # why the last connection attempt failed (None: it did not)

    @property
    def uses_tls(self) -> bool:
        return self._tls is not None

    @classmethod
    def from_url(cls, url: str, timeout_s: float) -> "RespPool":
        """redis://[[user]:password@]host[:port][/db] (rediss:// with the system's CAs); see factory.open_pool
        for the typed TLS options, Sentinel and Cluster."""
        target = parse_redis_url(url)
        (host, port), tls = target.hosts[0], ssl.create_default_context() if target.tls else None
        return cls(host, port, db=target.db, password=target.password, username=target.username,
                   timeout_s=timeout_s, tls=tls)  # fmt: skip

    @property
    def connected(self) -> bool:
        return self._connection is not None and not self._connection.closed

    async def connect(self) -> None:
        """Waits for a connection (the first one: raises why it failed, AuthenticationError included)."""
        if not self.connected:
            await asyncio.shield(self._reconnect())

    async def call(self, *parts: str | bytes | int | float) -> Any:
        """One command's reply (see send)."""
        return await self.send(*parts)

    def send(self, *parts: str | bytes | int | float, lazy: bool = False) -> "asyncio.Future[Any]":
        """Queues the command at once, behind every command sent before it, and returns its future reply,
        bounded by timeout_s; `lazy` lets it wait up to LAZY_FLUSH_S to share the next command's write. A caller that stops waiting leaves the connection usable (its reply is read
        and dropped in turn). Without a connection: the first one is waited for (bounded by the connect
        timeout); a lost one is reopened in the background while calls fail at once."""
        conn = self._connection
        if conn is not None and not conn.closed:
            reply = conn.send(encode(*parts), lazy)
            return _bounded(conn.loop.time() + self._timeout_s, self._timeout_s, conn, reply)
        connecting = self._reconnect()
        if self._ever_connected:
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(ConnectionError(f"not connected to Redis at {self.where} (reconnecting)"))
            return failed
        return asyncio.ensure_future(self._send_when_connected(connecting, parts))

    async def _send_when_connected(
        self, connecting: "asyncio.Task[_Connection]", parts: tuple[str | bytes | int | float, ...]
    ) -> Any:
        conn = await asyncio.shield(connecting)
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        return await _bounded(deadline, self._timeout_s, conn, conn.send(encode(*parts)))

    def _lost(self) -> None:
        if self._ever_connected and not self._closed:
            self._reconnect()
            if self.lost_hook is not None:
                self.lost_hook()

    def _reconnect(self) -> "asyncio.Task[_Connection]":
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._connect_until_up())
            self._connecting.add_done_callback(_retrieve)  # a failure reaches the callers waiting, if any
        return self._connecting

    async def _connect_until_up(self) -> _Connection:
        """One attempt before the first connection; after it, attempts every RECONNECT_EVERY_S until one
        succeeds (or the pool closes), so Redis is usable again moments after it returns."""
        while True:
            try:
                self._connection = await self._connect()
                self._ever_connected = True
                self.problem = None
                if self._resolve is not None and self._watching is None:
                    self._watching = asyncio.get_running_loop().create_task(self._watch(self._resolve))
                return self._connection
            except (RedisError, OSError) as exc:
                self.problem = exc
                if not self._ever_connected or self._closed:
                    raise
            await asyncio.sleep(RECONNECT_EVERY_S)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                if self._resolve is not None:
                    self._address = await self._resolve()
                host = self._address[0]
                tls = (
                    {"ssl": self._tls, "server_hostname": self._server_hostname or host} if self._tls else {}
                )
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, self._lost, self._role_check), *self._address, **tls
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectionError(f"cannot connect to Redis at {self.where} ({_reason(exc)})") from exc
        replies = [_bounded(deadline, self._connect_timeout_s, conn, conn.send(c)) for c in self._setup]
        try:
            answers = await asyncio.gather(*replies)
            if self._role_check and answers[-1][0] not in (b"master", "master"):
                raise ConnectionError(f"Redis at {self.where} is not the master (a failover under way)")
        except BaseException:
            conn.close()
            raise
        return conn

    async def _watch(self, resolve: Resolver) -> None:
        """Sentinel: after a failover the old master may answer as one for seconds more (until the Sentinels
        turn it into a replica); asked every SENTINEL_CHECK_S, a master that moved is followed at once."""
        while not self._closed:
            await asyncio.sleep(SENTINEL_CHECK_S)
            try:
                async with asyncio.timeout(self._connect_timeout_s):
                    address = await resolve()
            except (RedisError, OSError, TimeoutError):
                continue
            conn = self._connection
            if address != self._address and conn is not None and not conn.closed:
                conn.close()  # connection_lost: reconnect, to the address the Sentinels name now

    def preload(self, source: str) -> None:
        """Load a script on every new connection, so calls queued in order run in order (no NOSCRIPT)."""
        self._setup.insert(len(self._setup) - self._role_check, encode("SCRIPT", "LOAD", source))

    @property
    def where(self) -> str:
        return f"{self._address[0]}:{self._address[1]}"

    def redirect(self, error: RedisError, parts: tuple) -> "asyncio.Future[Any] | None":
        return None  # one Redis: MOVED means it is a cluster node (connect.check_access says so at start)

    def close(self) -> None:
        self._closed = True
        for task in (self._connecting, self._watching):
            if task is not None:
                task.cancel()
        if self._connection is not None:
            self._connection.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _retrieve(task: "asyncio.Task[Any]") -> None:
    if not task.cancelled():
        task.exception()


def _bounded(
    deadline: float, timeout_s: float, conn: _Connection, reply: "asyncio.Future[Any]"
) -> "asyncio.Future[Any]":
    """`reply`, failed with TimeoutError once Redis has sent nothing on `conn` for `timeout_s` past
    `deadline` (a paused or stuck Redis), and in any case after PROGRESS_CAP × timeout_s (a Redis that
    is answering, but a burst queued ahead of this call). A reply already received when a timer fires
    wins: the event loop hands a turn's socket data to data_received before it runs that turn's timers.
    """
    last_chance = deadline + (PROGRESS_CAP - 1) * timeout_s
    timer = conn.loop.call_at(deadline, _expire, conn, reply, timeout_s, last_chance)
    reply.add_done_callback(lambda _: timer.cancel())
    return reply


def _expire(conn: _Connection, reply: "asyncio.Future[Any]", timeout_s: float, last_chance: float) -> None:
    """A reply that did not come: drop the connection (later replies would be misattributed)."""
    if reply.done():
        return
    progressing_until = conn.last_data_at + timeout_s
    if conn.loop.time() < min(progressing_until, last_chance):
        timer = conn.loop.call_at(
            min(progressing_until, last_chance), _expire, conn, reply, timeout_s, last_chance
        )
        reply.add_done_callback(lambda _: timer.cancel())
        return
    reply.set_exception(RedisTimeoutError("Redis did not answer in time"))
    conn.close()


class Pool(Protocol):
    """What the limiter sends through: RespPool (one Redis, or the Sentinels' master) or ClusterPool."""

    problem: BaseException | None  # why the last connection attempt failed

    @property
    def connected(self) -> bool: ...

    @property
    def where(self) -> str: ...

    async def connect(self) -> None: ...

    async def call(self, *parts: str | bytes | int | float) -> Any: ...

    def send(self, *parts: str | bytes | int | float, lazy: bool = False) -> "asyncio.Future[Any]": ...

    def preload(self, source: str) -> None: ...

    def redirect(self, error: RedisError, parts: tuple) -> "asyncio.Future[Any] | None":
        """The command sent again where a MOVED or ASK reply says (Redis Cluster), or None."""
        ...

    def close(self) -> None: ...


from policies.ratelimit.script import LuaScript  # noqa: E402  (here too, for the callers of old)

__all__ = ["LuaScript", "Pool", "RespPool", "encode"]
