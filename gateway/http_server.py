"""uvicorn's httptools protocol, with the writes of one event-loop step sent as one `write()`.

uvicorn writes a response's status line and headers, then its body, with two `transport.write()` calls,
and uvloop sends each at once: two syscalls, and on loopback each one wakes the peer. Measured with
py-spy under wrk (studies/README.md, "Gateway overhead"), those two writes were ~24 % of the gateway's
CPU per request. `CoalescingTransport` holds what is written during one step of the loop and writes it
with one call at the next step (`loop.call_soon`): headers and body leave together, and a streamed
chunk still leaves within one loop iteration. Everything else is uvicorn's own code.
"""

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """A transport that joins the writes made within one loop step; all else goes to the real one."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """Pass as `uvicorn.run(..., http=CoalescingHttpToolsProtocol)`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = CoalescingTransport(transport, self.loop)  # type: ignore[assignment]
