"""Real processes for the chaos suite and the soak benchmark: Redis, PostgreSQL, the fake upstream and
gateway replicas, each on its own port in a range reserved for it, each with start / kill / restart.

Ports: Redis 16390-16399, PostgreSQL 15440-15449, gateways and fake upstreams 18100-18199.
Everything binds 127.0.0.1 and is stopped by the fixture that started it (no process outlives a run).
Runs in parallel on one machine (CI and a developer, several checkouts) never share a port: each port
handed out is held with a lock file under /tmp/llmgw-chaos-ports until the process that took it exits.
"""

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import httpx

from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
REDIS_PORTS = range(16390, 16400)
POSTGRES_PORTS = range(15440, 15450)
HTTP_PORTS = range(18100, 18200)
PG_BIN = Path("/usr/lib/postgresql/15/bin")
MASTER_KEY = "sk-chaos-master"
ADMIN_TOKEN = "chaos-admin-token"
LOCKS = Path(tempfile.gettempdir()) / "llmgw-chaos-ports"
_held: dict[int, int] = {}  # port -> the locked file descriptor (kept open: the lock lasts as long as we do)


def free_port(ports: Iterable[int]) -> int:
    """The first port of the range that no process on this machine holds and nobody listens on."""
    LOCKS.mkdir(exist_ok=True)
    for port in ports:
        if port in _held:
            continue
        fd = os.open(LOCKS / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if _bindable(port):
            _held[port] = fd
            return port
        os.close(fd)
    raise RuntimeError(f"no free port in {ports}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(check: "callable", what: str, timeout_s: float = 60.0) -> None:  # type: ignore[valid-type]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready within {timeout_s}s")


def _stop(process: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
    if process is None or process.poll() is not None:
        return None if process is None else process.returncode
    process.send_signal(sig)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(10)


class PostgresCluster:
    """A PostgreSQL cluster of our own (initdb into /tmp as the postgres user): stop and start it at will."""

    def __init__(self) -> None:
        self.port = free_port(POSTGRES_PORTS)
        self.dir = Path(tempfile.mkdtemp(prefix="llmgw-chaos-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    @staticmethod
    def available() -> str | None:
        """Why this machine cannot run one, or None."""
        if os.geteuid() != 0:
            return "needs root, to run initdb as the postgres user"
        if shutil.which("runuser") is None or not (_pg_bin("initdb") and _pg_bin("pg_ctl")):
            return "PostgreSQL server binaries (initdb, pg_ctl) not found"
        return None

    def init(self) -> "PostgresCluster":
        shutil.chown(self.dir, "postgres", "postgres")
        self._as_postgres("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync",
                          "-E", "UTF8", "--locale", "C")  # fmt: skip
        return self.start()

    def start(self) -> "PostgresCluster":
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
        )
        self._as_postgres("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60",
                          "start")  # fmt: skip
        return self

    def stop(self) -> None:
        """Fast shutdown: open connections are cut, as in a crash or a fail-over."""
        if (self.data / "postmaster.pid").exists():
            self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _as_postgres(self, program: str, *args: str) -> None:
        command = ["runuser", "-u", "postgres", "--", str(_pg_bin(program)), *args]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.dir)


def _pg_bin(program: str) -> Path | None:
    if (PG_BIN / program).exists():
        return PG_BIN / program
    found = shutil.which(program)
    return Path(found) if found else None


class Upstream:
    """The fake OpenAI upstream (tests/fakes.py) as its own process; `delay_s` makes every answer slow."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.port = free_port(HTTP_PORTS)
        self.delay_s = delay_s
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Upstream":
        command = [
            sys.executable,
            "-m",
            "tests.fakes",
            "--port",
            str(self.port),
            "--delay",
            str(self.delay_s),
        ]
        self.process = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)  # fmt: skip
        wait_for(lambda: _get(self.url + "/v1/models") == 200, f"fake upstream on {self.port}", 60)
        return self

    def kill(self) -> None:
        _stop(self.process, signal.SIGKILL)

    def stop(self) -> None:
        _stop(self.process)


class Gateway:
    """`python -m gateway.cli serve` with LLMGW_* settings, its output in a log file."""

    def __init__(self, env: dict[str, str], workers: int = 1, log_dir: Path | None = None) -> None:
        self.port = free_port(HTTP_PORTS)
        self.env = env
        self.workers = workers
        self.log = (log_dir or Path(tempfile.mkdtemp(prefix="llmgw-chaos-"))) / f"gateway-{self.port}.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> "Gateway":
        command = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(self.port)]
        command += ["--workers", str(self.workers)]
        self.process = subprocess.Popen(command, cwd=ROOT, env=_env(self.env), stdout=self.log.open("wb"),
                                        stderr=subprocess.STDOUT)  # fmt: skip
        return self

    def wait_ready(self, timeout_s: float = 240.0) -> "Gateway":
        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}:\n{self.log_tail()}")
            return _get(self.url + "/health/live") == 200

        wait_for(ready, f"gateway on {self.port}", timeout_s)
        return self

    def terminate(self, timeout_s: float = 60.0) -> int | None:
        return _stop(self.process, signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        _stop(self.process, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def gateway_env(database_url: str, schema: str, models: list[dict], redis_url: str | None = None,
                **extra: str) -> dict[str, str]:  # fmt: skip
    """Settings of a chaos replica: our own database schema and Redis, no semantic cache, quick failover."""
    env = {
        "LLMGW_DATABASE_URL": database_url,
        "LLMGW_POLICIES__DB_SCHEMA": schema,
        "LLMGW_POLICIES__AUTO_MIGRATE": "false",
        "LLMGW_POLICIES__REFRESH_INTERVAL_S": "2",
        "LLMGW_POLICIES__REDIS_PREFIX": f"chaos:{schema}:",
        "LLMGW_MASTER_KEY": MASTER_KEY,
        "LLMGW_ADMIN_TOKEN": ADMIN_TOKEN,
        "LLMGW_CACHE__ENABLED": "false",
        "LLMGW_LOG_LEVEL": "warning",
        "LLMGW_MODELS": json.dumps(models),
    }
    if redis_url:
        env["LLMGW_REDIS_URL"] = redis_url
    return env | extra


def deployment(name: str, upstream: Upstream, read_timeout_s: float = 10.0) -> dict:
    return {"name": name, "base_url": upstream.url + "/v1", "model": "upstream-model",
            "read_timeout_s": read_timeout_s, "connect_timeout_s": 1.0}  # fmt: skip


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env | (extra or {})


def _get(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def chaos_redis() -> RedisServer:
    """A started redis-server of our own on a free port of the chaos range."""
    return RedisServer(free_port(REDIS_PORTS)).start()
