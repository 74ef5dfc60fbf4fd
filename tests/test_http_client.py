"""backends/http_client.py against a raw asyncio server: bodies read whole or in chunks, keep-alive reuse,
and a connection dropped (never reused) when a read times out or the caller stops early."""

import asyncio

import pytest

from backends.http_client import HttpPool, TransportError

CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
HEAD_ONLY = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345"  # then nothing: the body never ends


class Server:
    """Answers each request on a connection with the next canned response; counts connections."""

    def __init__(self, responses: list[bytes]) -> None:
        self.responses = responses
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.responses:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(self.responses.pop(0))
                await writer.drain()
            await reader.read()  # keep the connection open until the client closes it
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve():
    servers = []

    async def start(responses: list[bytes]) -> tuple[Server, HttpPool]:
        server = Server(responses)
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        servers.append(listener)
        port = listener.sockets[0].getsockname()[1]
        pool = HttpPool(f"http://127.0.0.1:{port}/v1", max_connections=4, connect_timeout=2, read_timeout=0.3)
        return server, pool

    yield start
    for listener in servers:
        listener.close()


async def test_read_joins_the_chunks_and_reuses_the_connection(serve):
    server, pool = await serve([CHUNKED, CHUNKED])
    for _ in range(2):
        response = await pool.request("POST", "/chat", b"{}")
        assert response.status == 200 and await response.read() == b"hello world"
    assert server.connections == 1
    await pool.aclose()


async def test_iter_chunks_yields_the_body_and_reuses_the_connection(serve):
    server, pool = await serve([CHUNKED, CHUNKED])
    response = await pool.request("POST", "/chat", b"{}")
    assert b"".join([chunk async for chunk in response.iter_chunks()]) == b"hello world"
    assert await (await pool.request("POST", "/chat", b"{}")).read() == b"hello world"
    assert server.connections == 1
    await pool.aclose()


async def test_a_read_that_times_out_drops_the_connection(serve):
    server, pool = await serve([HEAD_ONLY, CHUNKED])
    response = await pool.request("POST", "/chat", b"{}")
    with pytest.raises(TransportError) as failed:
        await response.read()
    assert failed.value.timeout
    assert await (await pool.request("POST", "/chat", b"{}")).read() == b"hello world"
    assert server.connections == 2
    await pool.aclose()


async def test_stopping_early_drops_the_connection(serve):
    server, pool = await serve([CHUNKED, CHUNKED])
    response = await pool.request("POST", "/chat", b"{}")
    chunks = response.iter_chunks()
    assert await anext(chunks) == b"hello"
    await chunks.aclose()
    assert await (await pool.request("POST", "/chat", b"{}")).read() == b"hello world"
    assert server.connections == 2
    await pool.aclose()
