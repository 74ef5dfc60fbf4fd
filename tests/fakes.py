"""A fake OpenAI-compatible upstream and helpers to run ASGI apps under uvicorn in a thread.

The fake's behaviour is steered by the last message's text:
  "fail:<status>"    answer with that HTTP status and an OpenAI error body ("fail:429:7": retry-after 7)
  "context-too-long" a 400 with code context_length_exceeded and param messages
  "die-mid-stream"   send two chunks, then drop the connection
  "sleep:<seconds>"  wait before answering
  "slow-stream[:<s>]" stream with a pause of <s> seconds (default 0.05) after each chunk
  "use-tool"         with `tools` in the body: call the first tool with {"city": "Paris"}
anything else        echo it back ("echo: <text>")

As its own process (chaos tests, bench/soak.py): python -m tests.fakes --port N [--delay SECONDS]
"""

import argparse
import asyncio
import socket
import threading
import time
from typing import Any

import orjson
import uvicorn

from tests import fakes_responses

Scope = dict[str, Any]
CONTEXT_TOO_LONG = {"message": "This model's maximum context length is 8192 tokens.",
                    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerThread:
    """Runs an ASGI app under uvicorn on 127.0.0.1 in a background thread."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


_SERVED = ("/chat/completions", "/completions", "/embeddings", "/responses")


class FakeUpstream:
    """ASGI app speaking enough of the OpenAI API for gateway tests and benchmarks."""

    def __init__(self, name: str = "fake", delay_s: float = 0.0) -> None:
        self.name = name
        self.delay_s = delay_s  # every completion waits this long first (a slow backend)
        self.requests: list[dict[str, Any]] = []
        self.cancelled = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["method"] == "GET":
            return await _json(send, 200, {"object": "list", "data": [{"id": self.name, "object": "model"}]})
        if not scope["path"].endswith(_SERVED):  # e.g. vLLM's /tokenize: OpenAI's API has none
            return await _json(send, 404, {"error": {"message": "Not Found", "type": "not_found"}})
        body = orjson.loads(await _read(receive))
        self.requests.append({"path": scope["path"], "body": body, "headers": dict(scope["headers"])})
        await self._answer(scope["path"], body, receive, send)

    async def _answer(self, path: str, body: dict[str, Any], receive: Any, send: Any) -> None:
        text = _last_text(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if text.startswith("sleep:"):
            await asyncio.sleep(float(text.split(":")[1]))
        if text.startswith("fail:"):  # fail:<status>[:<retry-after>]
            status, *retry_after = text.split(":")[1:]
            error = {"message": f"upstream says {status}", "type": "x"}
            return await _json(
                send, int(status), {"error": error}, dict(zip(["retry-after"], retry_after, strict=False))
            )
        if text == "context-too-long":
            return await _json(send, 400, {"error": CONTEXT_TOO_LONG})
        if path.endswith("/embeddings"):
            return await _json(send, 200, _embeddings(body))
        if path.endswith("/responses"):
            return await self._responses(body, send)
        if body.get("stream"):
            return await self._stream(body, text, send, receive)
        return await _json(send, 200, _completion(body, text))

    async def _responses(self, body: dict[str, Any], send: Any) -> None:
        if not body.get("stream"):
            return await _json(send, 200, fakes_responses.response(body))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for event in fakes_responses.events(body):
            frame = b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, body: dict[str, Any], text: str, send: Any, receive: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        words = f"echo: {text}".split(" ")
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(receive, gone))
        for i, chunk in enumerate(_chunks(body, words)):
            if text == "die-mid-stream" and i == 2:
                raise ConnectionError("fake upstream dies mid-stream")
            if gone.is_set():
                self.cancelled += 1
                return
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + orjson.dumps(chunk) + b"\n\n",
                    "more_body": True,
                }
            )
            if text.startswith("slow-stream"):
                await asyncio.sleep(_pause(text))
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        watcher.cancel()


def _pause(text: str) -> float:
    """The per-chunk pause of "slow-stream:<seconds> ..." (0.05 s when not given)."""
    head = text.split(" ", 1)[0]
    return float(head.split(":", 1)[1]) if ":" in head else 0.05


async def _watch_disconnect(receive: Any, gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


def _last_text(body: dict[str, Any]) -> str:
    if "messages" in body:
        content = body["messages"][-1].get("content") or ""
        if isinstance(content, str):
            return content
        return " ".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else str(prompt[0])


def _usage(body: dict[str, Any], completion_words: int) -> dict[str, int]:
    prompt = len(_last_text(body).split()) + 5
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_words,
        "total_tokens": prompt + completion_words,
    }


def _completion(body: dict[str, Any], text: str) -> dict[str, Any]:
    answer = f"echo: {text}"
    usage = _usage(body, len(answer.split(" ")))
    if "messages" in body:
        message = {"role": "assistant", "content": answer}
        finish = "stop"
        if _wants_tool(body, text):
            message, finish = (
                {"role": "assistant", "content": None, "tool_calls": [_tool_call(body)]},
                "tool_calls",
            )
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": finish,
            "logprobs": _logprobs(body, answer),
        }
        return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": body["model"],
                "choices": [choice], "usage": usage}  # fmt: skip
    choice = {"index": 0, "text": answer, "finish_reason": "stop", "logprobs": None}
    return {"id": "cmpl-fake", "object": "text_completion", "created": 1, "model": body["model"],
            "choices": [choice], "usage": usage}  # fmt: skip


def _logprobs(body: dict[str, Any], answer: str) -> dict[str, Any] | None:
    """A sure-of-itself model: every token at logprob -0.1."""
    if not body.get("logprobs"):
        return None
    return {"content": [{"token": w, "logprob": -0.1, "bytes": list(w.encode()), "top_logprobs": []}
                        for w in answer.split(" ")]}  # fmt: skip


def _chunks(body: dict[str, Any], words: list[str]) -> list[dict[str, Any]]:
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
    deltas = [{"role": "assistant", "content": ""}] + [
        {"content": w if i == 0 else " " + w} for i, w in enumerate(words)
    ]
    finish = "stop"
    if _wants_tool(body, _last_text(body)):
        call = _tool_call(body)
        head = {**call, "index": 0, "function": {"name": call["function"]["name"], "arguments": ""}}
        halves = ['{"city": ', '"Paris"}']
        deltas = [{"role": "assistant", "content": None, "tool_calls": [head]}]
        deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": half}}]} for half in halves]
        finish = "tool_calls"
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**base, "choices": [], "usage": _usage(body, len(words))})
    return chunks


def _wants_tool(body: dict[str, Any], text: str) -> bool:
    return bool(body.get("tools")) and text.startswith("use-tool")


def _tool_call(body: dict[str, Any]) -> dict[str, Any]:
    name = body["tools"][0]["function"]["name"]
    return {
        "id": "call_fake_1",
        "type": "function",
        "function": {"name": name, "arguments": '{"city": "Paris"}'},
    }


def _embeddings(body: dict[str, Any]) -> dict[str, Any]:
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    data = [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]} for i, _ in enumerate(inputs)]
    return {
        "object": "list",
        "data": data,
        "model": body["model"],
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }


async def _read(receive: Any) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _json(send: Any, status: int, payload: dict[str, Any], extra: dict[str, str] | None = None) -> None:
    data = orjson.dumps(payload)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            return await send({"type": "lifespan.shutdown.complete"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a fake OpenAI-compatible upstream")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds every completion waits first")
    args = parser.parse_args(argv)
    uvicorn.run(
        FakeUpstream(delay_s=args.delay),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
