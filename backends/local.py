"""The embedded engine: `llmgw engine serve` as a child process, spoken to like any OpenAI server.

Model compute runs in its own process, so it never blocks the gateway's event loop.
"""

import asyncio
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

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


class LocalEngineBackend:
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

    async def start(self) -> None:
        await self._http.start()
        command = [sys.executable, "-m", "backends.local_engine.cli", "serve", "--port", str(self._port)]
        env = {**os.environ, **engine_env(self._engine)}
        self._process = await asyncio.create_subprocess_exec(*command, env=env)
        log.info("started engine %s (pid %s) on 127.0.0.1:%s", self.name, self._process.pid, self._port)
        asyncio.get_running_loop().create_task(self._wait_ready())

    async def _wait_ready(self) -> None:
        deadline = asyncio.get_running_loop().time() + self._startup_timeout_s
        while self._process.returncode is None and asyncio.get_running_loop().time() < deadline:
            if await self._http.health():
                self._ready.set()
                log.info("engine %s is ready", self.name)
                return
            await asyncio.sleep(0.5)
        log.error("engine %s did not become ready (exit code %s)", self.name, self._process.returncode)

    async def health(self) -> bool:
        alive = self._process is not None and self._process.returncode is None
        return alive and self._ready.is_set() and await self._http.health()

    async def complete(self, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        self._check_ready()
        return await self._http.complete(endpoint, body, request_id)

    def stream(self, endpoint: str, body: dict[str, Any], request_id: str) -> AsyncIterator[dict[str, Any]]:
        self._check_ready()
        return self._http.stream(endpoint, body, request_id)

    def _check_ready(self) -> None:
        if not self._ready.is_set():
            raise UpstreamError(503, f"the local engine {self.name} is still loading", retryable=True)

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._process and self._process.returncode is None:
            self._process.terminate()
            try:
                await asyncio.wait_for(self._process.wait(), timeout=10)
            except TimeoutError:
                self._process.kill()
