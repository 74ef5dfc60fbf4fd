"""Two gateway replicas as separate uvicorn processes sharing one Redis and one database.

`app` is "policies" (tests.policies_replica: the policies stages in front of an answerer) or
"gateway" (the lead's gateway.app in front of the fake upstream; used once it wires policies).
"""

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from policies.migrate import upgrade_async
from tests.fakes import free_port
from tests.policies_support import ADMIN_TOKEN, POSTGRES_URL, REDIS_URL, _postgres

ROOT = Path(__file__).resolve().parents[1]
FACTORIES = {
    "policies": "tests.policies_replica:create_app",
    "gateway": "tests.policies_replica:create_gateway_app",
}


@dataclass
class Fleet:
    app: str
    db: str
    tmp: Path
    upstream_url: str | None = None
    urls: list[str] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    prefix: str = field(default_factory=lambda: f"llmgw-test:{uuid.uuid4().hex[:12]}:")
    schema: str | None = None
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def database_file(self) -> Path:
        return self.tmp / "fleet.db"

    def start(self) -> "Fleet":
        url = f"sqlite+aiosqlite:///{self.database_file}"
        if self.db == "postgresql":
            url, self.schema = POSTGRES_URL, f"llmgw_fleet_{uuid.uuid4().hex[:12]}"
            asyncio.run(_postgres(f"CREATE SCHEMA {self.schema}"))
        asyncio.run(upgrade_async(url, self.schema))  # once, before the replicas start
        env = self._env(url)
        for i in range(2):
            port = free_port()
            self.urls.append(f"http://127.0.0.1:{port}")
            self.logs.append(self.tmp / f"replica{i}.log")
            self.processes.append(self._spawn(port, env, self.logs[-1]))
        for url_, process in zip(self.urls, self.processes, strict=True):
            _wait_ready(url_, process)
        return self

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        stuck = []
        for process in self.processes:  # every replica stopped even when one hangs (then the test fails)
            try:
                process.wait(timeout=40)  # its shutdown is bounded by the grace period (30 s)
            except subprocess.TimeoutExpired:
                process.kill()
                stuck.append(process.args)
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match=self.prefix + "*", count=1000):
            client.delete(key)
        client.close()
        if self.schema:
            asyncio.run(_postgres(f"DROP SCHEMA {self.schema} CASCADE"))
        assert not stuck, f"replicas did not exit within 40 s of SIGTERM: {stuck}"

    def log_tails(self, lines: int = 30) -> str:
        """The last lines each replica logged (secrets masked), for a failure's message."""
        parts = []
        for path in self.logs:
            text = path.read_text(errors="replace")
            for secret in self.secrets:
                text = text.replace(secret, "sk-***")
            parts.append(f"--- {path.name}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts)

    def _env(self, database_url: str) -> dict[str, str]:
        env = {**os.environ, "LLMGW_DATABASE_URL": database_url, "LLMGW_REDIS_URL": REDIS_URL}
        env |= {"LLMGW_ADMIN_TOKEN": ADMIN_TOKEN, "LLMGW_MASTER_KEY": "sk-fleet-master"}
        env |= {"LLMGW_POLICIES__REDIS_PREFIX": self.prefix, "LLMGW_POLICIES__AUTO_MIGRATE": "false"}
        # exactness, not fault tolerance, is measured here: the shared Redis on a loaded 2-core box can be
        # silent for longer than the 50 ms default, which would (rightly) fail over to per-replica shares
        env["LLMGW_POLICIES__REDIS_TIMEOUT_S"] = "2"
        if self.schema:
            env["LLMGW_POLICIES__DB_SCHEMA"] = self.schema
        if self.upstream_url:  # the full gateway, without the semantic cache's model load
            env["LLMGW_CACHE__ENABLED"] = "false"
            deployment = {"name": "fake-1", "base_url": self.upstream_url + "/v1", "model": "upstream-model"}
            env["LLMGW_MODELS"] = json.dumps([{"name": "m", "deployments": [deployment]}])
        return env

    def _spawn(self, port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
        command = [sys.executable, "-m", "uvicorn", FACTORIES[self.app], "--factory"]
        command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "info"]
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _wait_ready(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert process.poll() is None, "replica exited"
        try:
            httpx.get(url + "/docs", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("replica did not start")
