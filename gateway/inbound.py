"""What the client sends besides the JSON: its size, a compressed body (gzip/deflate), its own request id."""

import re
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from core.errors import OpenAIError
from core.validation import too_large

_CLIENT_ID = re.compile(rb"[!-~]{1,64}")  # visible ASCII, at most the 64 the usage table keeps
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def client_request_id(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The client's x-request-id when it is usable (1–64 visible ASCII characters), else None."""
    for name, value in headers:
        if name.lower() == b"x-request-id":
            return value.decode() if _CLIENT_ID.fullmatch(value) else None
    return None


def decode_body(raw: bytes, content_encoding: str, limit: int) -> bytes:
    """The body with its Content-Encoding undone; 413 when it inflates past `limit` bytes."""
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return raw
    if coding not in _WBITS:
        raise OpenAIError(
            415,
            f"Unsupported Content-Encoding {coding!r}: use gzip, deflate or none.",
            code="unsupported_encoding",
        )
    body = _inflate(raw, _WBITS[coding], limit)
    if body is None and coding == "deflate":  # some clients send raw DEFLATE without the zlib wrapper
        body = _inflate(raw, -zlib.MAX_WBITS, limit)
    if body is None:
        raise OpenAIError(400, f"The body is not valid {coding} data.", code="invalid_encoding")
    return body


def _inflate(raw: bytes, wbits: int, limit: int) -> bytes | None:
    inflater = zlib.decompressobj(wbits)
    try:
        body = inflater.decompress(raw, limit + 1)
    except zlib.error:
        return None
    if len(body) > limit or inflater.unconsumed_tail:
        raise too_large(limit)
    if not inflater.eof:
        return None  # truncated
    return body


def declared_size(headers: list[tuple[bytes, bytes]]) -> int:
    """The Content-Length the client declared (0 if none or not a number)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


Receive = Callable[[], Awaitable[dict[str, Any]]]


def bounded_receive(receive: Receive, limit: int) -> Receive:
    """An ASGI receive that fails with a 413 once the body passes `limit` bytes (chunked uploads)."""
    seen = 0

    async def bounded() -> dict[str, Any]:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise too_large(limit)
        return message

    return bounded


async def read_body(receive: Any, headers: dict[str, str], limit: int) -> bytes:
    """The whole body, held to `limit` bytes as declared and as received (413), 400 if the client leaves."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise OpenAIError(400, "The client disconnected before sending the whole body.")
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise too_large(limit)
        parts.append(part)
        if not message.get("more_body"):
            return b"".join(parts)


async def decoded(scope: dict[str, Any], receive: Receive, limit: int) -> tuple[dict[str, Any], Receive]:
    """A request with a Content-Encoding, as the app sees it: the whole body read and inflated (or a 415, 400
    or 413), then replayed with the header gone. Requests without one pass as they are, still streamed."""
    coding = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"content-encoding"), "")
    if coding.strip().lower() in ("", "identity"):
        return scope, receive
    body = decode_body(await read_body(receive, {}, limit), coding, limit)
    dropped = (b"content-encoding", b"content-length")
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in dropped]
    headers.append((b"content-length", str(len(body)).encode()))
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()  # after the body: the client's disconnect, when it comes
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return {**scope, "headers": headers}, replay
