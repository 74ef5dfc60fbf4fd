"""The coalescing transport: writes of one loop step leave as one write, in order, and nothing is lost."""

import asyncio
import socket
from typing import Any

import pytest
import uvicorn

from gateway.http_server import CoalescingHttpToolsProtocol, CoalescingTransport


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_writes_of_one_step_leave_together_at_the_next() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"body")
    assert real.writes == []
    await asyncio.sleep(0)
    assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    transport.write(b"next")
    await asyncio.sleep(0)
    assert real.writes[1:] == [b"next"]


async def test_close_flushes_first_and_other_calls_reach_the_real_transport() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"last words")
    transport.close()
    assert real.writes == [b"last words"] and real.closed
    assert transport.get_extra_info("peername") == "info:peername"
    await asyncio.sleep(0)
    assert real.writes == [b"last words"]  # the scheduled flush finds nothing left


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = scope["path"].encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def server() -> Any:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(_app, host="127.0.0.1", port=port, http=CoalescingHttpToolsProtocol,
                            lifespan="off", log_level="warning")  # fmt: skip
    serving = uvicorn.Server(config)
    task = asyncio.create_task(serving.serve())
    while not serving.started:
        await asyncio.sleep(0.01)
    yield port
    serving.should_exit = True
    await asyncio.wait_for(task, 30)


async def test_keep_alive_responses_arrive_whole_and_in_order(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(b"GET /first HTTP/1.1\r\nhost: t\r\n\r\nGET /second HTTP/1.1\r\nhost: t\r\n\r\n")
    received = b""
    while received.count(b"HTTP/1.1 200 OK") < 2 or not received.endswith(b"/second"):
        chunk = await asyncio.wait_for(reader.read(65536), 30)
        assert chunk, received
        received += chunk
    assert received.index(b"/first") < received.index(b"/second")
    writer.close()
