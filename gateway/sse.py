"""Server-sent events out, and usage bookkeeping on the way."""

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import orjson

from gateway.context import RequestContext, Usage
from gateway.errors import OpenAIError

DONE = b"data: [DONE]\n\n"
log = logging.getLogger("llmgw.sse")


def event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def track_usage(
    ctx: RequestContext, chunks: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[dict[str, Any]]:
    """Fill ctx.usage from the usage chunk; count content chunks so a cut stream still settles."""
    produced = 0
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                if chunk.get("usage"):
                    ctx.usage = Usage.from_openai(chunk["usage"])
                elif chunk.get("choices"):
                    produced += 1
                yield chunk
    finally:
        if not ctx.usage.completion_tokens:
            ctx.usage.completion_tokens = produced


async def sse_body(ctx: RequestContext, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Frame chunks as SSE. An error after the first byte ends the stream with an error event, no [DONE]."""
    try:
        async for chunk in chunks:
            if not ctx.include_usage and "usage" in chunk:
                if not chunk.get("choices"):
                    continue
                chunk = {k: v for k, v in chunk.items() if k != "usage"}
            yield event(chunk)
    except OpenAIError as error:
        yield event(error.to_dict())
        return
    except Exception:
        log.exception("stream %s failed", ctx.request_id)
        yield event(OpenAIError(500, "The gateway failed while streaming the response.").to_dict())
        return
    yield DONE


class SSEResponse:
    """Streams SSE frames; when the client disconnects, the stream (and so the upstream call) is cancelled."""

    def __init__(self, frames: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        self.frames = frames
        self.headers = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no",
                        **headers}  # fmt: skip

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        streaming = asyncio.current_task()
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
        watcher.add_done_callback(lambda w: w.cancelled() or streaming.cancel())
        raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": raw_headers})
            async for frame in self.frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watcher.done() or watcher.cancelled():
                raise
            log.info("client left during the stream; upstream call cancelled")
        finally:
            watcher.cancel()
            await self.frames.aclose()


async def _wait_for_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
