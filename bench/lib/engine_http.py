"""The benchmarks' OpenAI-style HTTP client and the servers it drives, each started on a free local port.

`EngineServer` runs `llmgw engine serve` (python -m backends.local_engine.cli serve) with engine settings as
LLMGW_ENGINE__* variables; `LlamaServer` runs llama.cpp's llama-server (bench/lib/llama_cpp.py). Both are read
by the same `one()`: one streamed request, its time to first token, gaps between chunks and token count.
"""

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.lib.harness import ROOT, free_port
from bench.lib.llama_cpp import LlamaCpp


@dataclass
class Request:
    prompt_ids: list[int] | None
    max_tokens: int
    arrival: float = 0.0  # seconds after start (Poisson); 0 in closed loops
    messages: list[dict] | None = None
    text: str | None = None  # a text prompt instead of token ids


@dataclass
class Result:
    ttft: float
    gaps: list[float]
    e2e: float
    tokens: int
    text: str = ""


COUNTER = (
    r"^(vllm:(?:[a-z_]+_total|iteration_tokens_total_(?:sum|count)|num_requests_running|num_requests_waiting"
    r"|kv_cache_usage_perc)|llmgw_engine_(?:step|budget)_seconds_total)\{[^}]*\} ([0-9.e+]+)$"
)


class EngineServer:
    """`llmgw engine serve` on a free port, with `settings` as LLMGW_ENGINE__* variables."""

    headers: dict[str, str] = {}  # extra request headers (read only)

    def __init__(self, **settings: object) -> None:
        self.port = free_port()
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        # an engine setting becomes LLMGW_ENGINE__<NAME>; a name already LLMGW_... is a variable of its own
        env.update(
            {
                k if k.startswith("LLMGW_") else f"LLMGW_ENGINE__{k.upper()}": str(v)
                for k, v in settings.items()
            }
        )
        command = [sys.executable, "-m", "backends.local_engine.cli", "serve", "--port", str(self.port)]
        self.process = subprocess.Popen(command, env=env, cwd=ROOT)
        self.url = f"http://127.0.0.1:{self.port}"

    async def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError("the engine server exited")
                try:
                    async with http.get(f"{self.url}/health") as response:
                        if response.status == 200:
                            return
                        if "engine_load_failed" in await response.text():
                            raise RuntimeError("the engine failed to load (its log says why)")
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise TimeoutError("the engine did not become ready")

    async def counters(self) -> dict[str, float]:
        """The engine's vllm:*_total counters, its steps and their tokens (iteration_tokens_total's count and sum)
        its running / waiting gauges and KV-cache usage, summed over labels."""
        async with aiohttp.ClientSession() as http, http.get(f"{self.url}/metrics") as response:
            text = await response.text()
        values: dict[str, float] = {}
        for match in re.finditer(COUNTER, text, re.M):
            values[match[1]] = values.get(match[1], 0.0) + float(match[2])
        return values

    async def one(self, http: aiohttp.ClientSession, request: Request) -> Result:
        endpoint, body = self._body(request)
        start = time.perf_counter()
        stamps, text, tokens = [], "", 0
        async with http.post(f"{self.url}/v1/{endpoint}", json=body, headers=self.headers) as response:
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices"):
                    stamps.append(time.perf_counter())
                    choice = chunk["choices"][0]
                    text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
        gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
        return Result(stamps[0] - start, gaps, stamps[-1] - start, tokens, text)

    @staticmethod
    def _body(request: Request) -> tuple[str, dict]:
        common = {"model": "smollm2", "max_tokens": request.max_tokens, "temperature": 0, "stream": True}
        common["stream_options"] = {"include_usage": True}
        if request.messages is not None:
            return "chat/completions", {**common, "messages": request.messages}
        prompt = request.text if request.text is not None else request.prompt_ids
        return "completions", {**common, "prompt": prompt, "ignore_eos": True}

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


class LlamaServer(EngineServer):
    """llama.cpp's `llama-server` (bench/lib/llama_cpp.py) on a free port, driven by the same client as the engine."""

    # llama-server drops a kept-alive connection after a streamed answer; a new one per request (~0.1 ms)
    headers = {"Connection": "close"}

    def __init__(self, llama: LlamaCpp) -> None:
        self.port = free_port()
        self.command = llama.server_command(self.port)
        # its per-request logging goes to a file, off the printed table
        self.log = Path(tempfile.gettempdir(), f"llama_server_{self.port}.log")
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=llama.env()
            )
        self.url = f"http://127.0.0.1:{self.port}"
