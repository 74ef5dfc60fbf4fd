"""A small keep-alive HTTP/1.1 client on asyncio protocols and the httptools parser.

Chosen by measurement (studies/README.md): per request it costs a fraction of aiohttp's CPU and a tenth
of httpx's. It does only what the gateway needs: POST/GET with a body, a pool of keep-alive connections
per origin, connect and read timeouts, streamed response bodies, and closing the connection when the
caller stops reading (so the upstream sees the cancellation).
"""

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools


class TransportError(Exception):
    """The connection failed, broke or timed out; `timeout` tells which."""

    def __init__(self, message: str, *, timeout: bool = False, sent: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.sent = sent  # the request may have reached the server


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self._waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(TransportError(f"invalid HTTP response: {exc}", sent=True))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(TransportError("the upstream closed the connection", sent=True))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()  # only valid inside this callback
        self.complete = True
        self._wake()

    # waiting for the parser
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
        self.closed = True

    async def wait(self, timeout: float) -> None:
        if self.closed and not self.complete:
            raise TransportError("the upstream closed the connection", sent=True)
        self._waiter = self._loop.create_future()
        timer = self._loop.call_later(
            timeout, self._fail, TransportError("read timed out", timeout=True, sent=True)
        )
        try:
            await self._waiter
        finally:
            timer.cancel()
            self._waiter = None

    def start(self, request: bytes) -> None:
        self._reset()
        self.transport.write(request)

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Response:
    """A response whose body arrives in chunks. Read it fully, or close it to drop the connection."""

    def __init__(self, pool: "HttpPool", conn: _Connection, read_timeout: float) -> None:
        self._pool = pool
        self._conn = conn
        self._read_timeout = read_timeout
        self.status = conn.status
        self.headers = conn.headers
        self._done = False

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        try:
            while (chunk := await self._next_chunk()) is not None:
                yield chunk
        finally:
            self._finish(reuse=False)

    async def drain(self) -> None:
        """Read what is left (e.g. the chunked terminator after an SSE [DONE]) so the connection is reused."""
        async for _ in self.iter_chunks():
            pass

    async def read(self) -> bytes:
        """The whole body (no async generator: the event loop registers each one it sees)."""
        chunks = []
        try:
            while (chunk := await self._next_chunk()) is not None:
                chunks.append(chunk)
        finally:
            self._finish(reuse=False)  # (a no-op once the body was read whole)
        return b"".join(chunks)

    async def _next_chunk(self) -> bytes | None:
        """The next piece of the body; None at its end, when the connection goes back to the pool. A
        failure or cancellation while waiting drops the connection."""
        conn = self._conn
        try:
            while not conn.chunks:
                if conn.complete:
                    self._finish(reuse=True)
                    return None
                await conn.wait(self._read_timeout)
        except BaseException:
            self._finish(reuse=False)
            raise
        return conn.chunks.popleft()

    async def iter_lines(self) -> AsyncIterator[bytes]:
        buffer = b""
        async for chunk in self.iter_chunks():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                yield line
        if buffer:
            yield buffer

    def _finish(self, reuse: bool) -> None:
        if self._done:
            return
        self._done = True
        self._pool.release(self._conn, reuse and self._conn.reusable())

    def close(self) -> None:
        self._finish(reuse=False)


class HttpPool:
    """Keep-alive connections to one origin (scheme://host:port)."""

    def __init__(
        self, base_url: str, *, max_connections: int, connect_timeout: float, read_timeout: float
    ) -> None:
        parts = urlsplit(base_url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._tls else 80)
        self.base_path = parts.path.rstrip("/")
        # what a server serves beside its versioned API (vLLM's /tokenize, /metrics): ".../v1" → "..."
        self.root_path = self.base_path.removesuffix("/v1")
        self._host_header = parts.netloc.encode()
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._ssl = ssl.create_default_context() if self._tls else None

    async def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                      read_timeout: float | None = None, beside_api: bool = False) -> Response:  # fmt: skip
        """Send a request and wait for the response headers. The body is read from the Response.

        `path` is under the base URL's path (`/chat/completions` → `/v1/chat/completions`), or, with
        `beside_api`, under its root (`/tokenize` → `/tokenize`)."""
        timeout = read_timeout or self._read_timeout
        prefix = self.root_path if beside_api else self.base_path
        request = self._encode(method, prefix + path, body, headers or {})
        await self._slots.acquire()
        conn = self._idle_connection()
        if conn is not None:
            try:
                return await self._exchange(conn, request, timeout)
            except TransportError as error:
                if error.timeout or conn.headers_done:
                    raise  # a stale keep-alive connection fails at once; anything else is real
                await self._slots.acquire()
        return await self._exchange(await self._connect_in_slot(), request, timeout)

    async def _exchange(self, conn: _Connection, request: bytes, timeout: float) -> Response:
        conn.start(request)
        try:
            while not conn.headers_done:
                await conn.wait(timeout)
        except BaseException:
            self.release(conn, reuse=False)
            raise
        return Response(self, conn, timeout)

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect_in_slot(self) -> _Connection:
        try:
            return await self._connect()
        except BaseException:
            self._slots.release()
            raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), self._host, self._port, ssl=self._ssl),
                self._connect_timeout,
            )
        except TimeoutError as exc:
            raise TransportError("connect timed out", timeout=True) from exc
        except OSError as exc:
            raise TransportError(f"cannot connect: {exc.strerror or exc}") from exc
        return conn

    def _encode(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [f"{method} {path} HTTP/1.1".encode(), b"host: " + self._host_header,
                 b"content-length: " + str(len(body)).encode()]  # fmt: skip
        lines += [f"{name}: {value}".encode() for name, value in headers.items()]
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    def release(self, conn: _Connection, reuse: bool) -> None:
        if reuse:
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    async def aclose(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
