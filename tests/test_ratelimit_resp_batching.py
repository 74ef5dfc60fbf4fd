"""Lazy commands (settlements) share the next eager command's write, in order, or leave on their own soon."""

import asyncio

from policies.ratelimit import resp


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        pass


def connection() -> tuple[resp._Connection, RecordingTransport]:
    conn = resp._Connection(asyncio.get_running_loop(), lambda: None)
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def test_a_lazy_command_leaves_with_the_next_eager_one_and_before_it() -> None:
    conn, transport = connection()
    conn.send(b"SETTLE\r\n", lazy=True)
    await asyncio.sleep(0)
    assert transport.writes == []
    conn.send(b"ADMIT\r\n")
    await asyncio.sleep(0)
    assert transport.writes == [b"SETTLE\r\nADMIT\r\n"]
    await asyncio.sleep(resp.LAZY_FLUSH_S * 3)
    assert transport.writes == [b"SETTLE\r\nADMIT\r\n"]  # the timer found nothing left


async def test_a_lazy_command_alone_leaves_after_the_lazy_delay() -> None:
    conn, transport = connection()
    conn.send(b"SETTLE\r\n", lazy=True)
    conn.send(b"SETTLE2\r\n", lazy=True)
    for _ in range(200):
        if transport.writes:
            break
        await asyncio.sleep(resp.LAZY_FLUSH_S)
    assert transport.writes == [b"SETTLE\r\nSETTLE2\r\n"]


async def test_calls_on_an_open_connection_use_its_loop_not_get_running_loop(monkeypatch) -> None:
    """asyncio.get_running_loop() is a getpid() syscall per call on Python 3.11: not on the request path."""
    conn, transport = connection()
    pool = resp.RespPool("127.0.0.1", 1, timeout_s=5.0)
    pool._connection = conn
    script = resp.LuaScript(pool, "return 1")

    def no_lookup() -> None:
        raise AssertionError("asyncio.get_running_loop() on the request path")

    monkeypatch.setattr(resp.asyncio, "get_running_loop", no_lookup)
    admitted = pool.send("EVALSHA", "sha", 0)
    settled = script.send([], ["member"], lazy=True)
    monkeypatch.undo()
    await asyncio.sleep(0)
    assert len(transport.writes) == 1 and transport.writes[0].count(b"EVALSHA") == 2
    conn.data_received(b":1\r\n:2\r\n")
    assert await admitted == 1 and await settled == 2
