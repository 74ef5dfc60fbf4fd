"""An OpenAI-compatible aiohttp upstream for routing tests, run in the test's own event loop.

Its `mode` says how the next requests go wrong; it can be stopped and restarted on the same port.
"""

import asyncio
import socket
from typing import Any

import orjson
from aiohttp import web

from backends.openai_compat import OpenAICompatBackend
from core.models import DeploymentConfig

MODES = ("ok", "error_500", "error_400", "headers_then_die", "die_mid_stream", "stall_mid_stream",
         "stall_before_first")  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Upstream:
    def __init__(self, name: str, answer: str = "fine", logprobs: list[float] | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.mode = "ok"
        self.answer = answer
        self.logprobs = logprobs or [-0.1] * len(answer.split())
        self.margins: list[float] | None = None  # top-1 − top-2 per token, sent when top_logprobs is asked
        self.cached_tokens = 0  # of the 10 prompt tokens, reported as served by the upstream's prefix cache
        self.metrics_text = ""
        self.requests: list[dict[str, Any]] = []
        self.failure: tuple[int, dict[str, Any], dict[str, str]] | None = None  # status, body, headers
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def deployment(self, **overrides: Any) -> DeploymentConfig:
        values = {"name": self.name, "base_url": self.base_url, "model": self.name, "read_timeout_s": 2.0,
                  "connect_timeout_s": 1.0, "input_price_per_1m": 1.0, "output_price_per_1m": 2.0}  # fmt: skip
        return DeploymentConfig(**{**values, **overrides})

    async def backend(self, **overrides: Any) -> OpenAICompatBackend:
        backend = OpenAICompatBackend(self.deployment(**overrides))
        await backend.start()
        return backend

    async def start(self) -> "Upstream":
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
            self._runner = None

    async def _models(self, request: web.Request) -> web.Response:
        status = 500 if self.mode == "error_500" else 200
        return web.json_response({"object": "list", "data": [{"id": self.name}]}, status=status)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text, content_type="text/plain")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.failure is not None:
            status, error, headers = self.failure
            return web.json_response(error, status=status, headers=headers)
        if self.mode in ("error_500", "error_400"):
            status = int(self.mode[-3:])
            return web.json_response({"error": {"message": f"{self.name} says {status}"}}, status=status)
        if body.get("stream"):
            return await self._stream(request, body)
        return web.json_response(self.completion(body))

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        tokens = self.answer.split()
        limit = body.get("max_tokens") or len(tokens)
        shown = tokens[:limit]
        content = [{"token": t, "logprob": lp, "bytes": [], "top_logprobs": self._top(body, lp, i)}
                   for i, (t, lp) in enumerate(zip(shown, self.logprobs, strict=False))]  # fmt: skip
        choice = {"index": 0, "message": {"role": "assistant", "content": " ".join(shown)},
                  "logprobs": {"content": content} if body.get("logprobs") else None,
                  "finish_reason": "length" if limit < len(tokens) else "stop"}  # fmt: skip
        usage = {"prompt_tokens": 10, "completion_tokens": len(shown), "total_tokens": 10 + len(shown)}
        if self.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return {"id": f"chatcmpl-{self.name}", "object": "chat.completion", "created": 1, "model": self.name,
                "choices": [choice], "usage": usage}  # fmt: skip

    def _top(self, body: dict[str, Any], logprob: float, index: int) -> list[dict[str, Any]]:
        if not body.get("top_logprobs") or self.margins is None:
            return []
        return [
            {"token": "best", "logprob": logprob},
            {"token": "next", "logprob": logprob - self.margins[index]},
        ]

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        if self.mode == "headers_then_die":
            request.transport.close()
            return response
        if self.mode == "stall_before_first":
            await asyncio.sleep(30)
        for i, chunk in enumerate(self.chunks(body)):
            if i == 2 and self.mode == "die_mid_stream":
                request.transport.close()
                return response
            if i == 2 and self.mode == "stall_mid_stream":
                await asyncio.sleep(30)
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    def chunks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        whole = self.completion(body)
        base = {k: whole[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        choice = whole["choices"][0]
        tokens = choice["message"]["content"].split()
        lps = (choice["logprobs"] or {}).get("content") or [None] * len(tokens)
        out = [{**base, "choices": [{"index": 0, "delta": {"content": ("" if i == 0 else " ") + t},
                                     "logprobs": {"content": [lp]} if lp else None, "finish_reason": None}]}
               for i, (t, lp) in enumerate(zip(tokens, lps, strict=False))]  # fmt: skip
        out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
        out.append({**base, "choices": [], "usage": whole["usage"]})
        return out
