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
