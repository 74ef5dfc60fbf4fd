"""Server-sent events out: the reply's chunks framed as SSE, and the ASGI response that sends them."""

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from core.context import RequestContext
from core.errors import OpenAIError
from core.sse import DONE, event

log = logging.getLogger("llmgw.sse")


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
