"""The embedded engine: `llmgw engine serve` as a child process, spoken to like any OpenAI server.

Model compute runs in its own process, so it never blocks the gateway's event loop.
"""

import asyncio
import logging
import os
import re
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import orjson

from backends.base import UpstreamError
from backends.local_engine.config import EngineSettings
from backends.openai_compat import OpenAICompatBackend
from core.models import DeploymentConfig

log = logging.getLogger("llmgw.engine")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def engine_env(engine: EngineSettings) -> dict[str, str]:
    """Engine settings as LLMGW_ENGINE__* variables, the way the child reads them."""
    values = engine.model_dump(mode="json", exclude_none=True)
    return {f"LLMGW_ENGINE__{name.upper()}": str(value) for name, value in values.items()}


def load_failure_kind(probe: tuple[int, bytes] | None) -> str | None:
    """The kind of failure (an exception's class name) when the engine answered `engine_load_failed`.

    The engine server says only the kind to its clients ("The engine failed to load (FileNotFoundError);
    see the server log."); its traceback is in the log. Any other answer, or none, gives None.
    """
    if probe is None or probe[0] != 503:
        return None
    try:
        error = orjson.loads(probe[1])["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(error, dict) or error.get("code") != "engine_load_failed":
        return None
    kind = re.search(r"\((\w+)\)", str(error.get("message", "")))
    return kind.group(1) if kind else "unknown error"


# How `llmgw engine serve` ends when it cannot serve (backends/local_engine/cli.py, serve.py)
_EXITS = {1: "the model failed to load", 2: "invalid engine settings"}


class LocalEngineBackend:
    """One deployment served by an engine child process: loading, then ready, or failed for good.

    While the model loads, requests get a retryable 503 `engine_not_ready`. A load that fails (the engine
    answers `engine_load_failed`, its process exits, or it is not ready within the startup timeout) is
    final: the details are logged once, the child is stopped, requests get a prompt 503
    `engine_load_failed` naming only the kind of failure, and /health/ready gives the reason.
    """

    def __init__(self, config: DeploymentConfig, engine: EngineSettings, startup_timeout_s: float) -> None:
        self.name = config.name
        self.config = config
        self._engine = engine if config.engine is None else EngineSettings.model_validate(config.engine)
        self._startup_timeout_s = startup_timeout_s
        self._port = free_port()
        self.base_url = f"http://127.0.0.1:{self._port}/v1"
        self._http = OpenAICompatBackend(config, base_url=self.base_url)
        self._process: asyncio.subprocess.Process | None = None
        self._ready = asyncio.Event()
        self._failure: str | None = None  # for clients and readiness: the kind of failure, no details
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._http.start()
        command = [sys.executable, "-m", "backends.local_engine.cli", "serve", "--port", str(self._port)]
        env = {**os.environ, **engine_env(self._engine)}
        self._process = await asyncio.create_subprocess_exec(*command, env=env)
        log.info("started engine %s (pid %s) on 127.0.0.1:%s", self.name, self._process.pid, self._port)
        self._watcher = asyncio.get_running_loop().create_task(self._wait_ready())

    async def _wait_ready(self) -> None:
        assert self._process is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._startup_timeout_s
        while loop.time() < deadline:
            if (code := self._process.returncode) is not None:
                await self._failed(_EXITS.get(code, "the engine process exited"), f"exit code {code}")
                return
            probe = await self._http.probe()
            if probe is not None and probe[0] == 200:
                self._ready.set()
                log.info("engine %s is ready", self.name)
                return
            if (kind := load_failure_kind(probe)) is not None:
                await self._failed(kind, "the engine's traceback is in the log above")
                return
            await asyncio.sleep(0.5)
        await self._failed(
            f"not ready within {self._startup_timeout_s:g} s", "raise engine_startup_timeout_s if it is slow"
        )

    async def _failed(self, kind: str, details: str) -> None:
        """Record a final load failure: one log line with the details, clients get the kind only."""
        self._failure = f"The local engine {self.name} failed to load ({kind}); see the gateway log."
        log.error(
            "engine %s failed to load: %s (%s); requests get 503 engine_load_failed", self.name, kind, details
        )
        await self._stop_process()

    async def health(self) -> bool:
        alive = self._process is not None and self._process.returncode is None
        return alive and self._ready.is_set() and await self._http.health()

    def unready_reason(self) -> str | None:
        return self._failure

    async def complete(self, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        self._check_ready()
        return await self._http.complete(endpoint, body, request_id)

    def stream(self, endpoint: str, body: dict[str, Any], request_id: str) -> AsyncIterator[dict[str, Any]]:
        self._check_ready()
        return self._http.stream(endpoint, body, request_id)

    async def tokenize(self, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        self._check_ready()
        return await self._http.tokenize(body, request_id)

    def _check_ready(self) -> None:
        if self._failure is not None:  # retryable: another deployment or a fallback may serve it
            raise UpstreamError(503, self._failure, retryable=True, code="engine_load_failed")
        if not self._ready.is_set():
            raise UpstreamError(
                503,
                f"The local engine {self.name} is still loading.",
                retryable=True,
                code="engine_not_ready",
            )

    async def aclose(self) -> None:
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
        await self._http.aclose()
        await self._stop_process()

    async def _stop_process(self) -> None:
        if self._process and self._process.returncode is None:
            self._process.terminate()
            try:
                await asyncio.wait_for(self._process.wait(), timeout=10)
            except TimeoutError:
                self._process.kill()
