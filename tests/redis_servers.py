"""Throw-away redis-server processes for fault tests and the chaos suite: fresh, empty, no persistence.

Never the shared Redis on 6379: these can be paused, killed, restarted empty, filled up or turned into
replicas. `redis_servers()` uses ports 16380-16389; the chaos suite hands in a locked free port.
"""

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

PORTS = range(16380, 16390)


class RedisServer:
    def __init__(self, port: int, workdir: Path | None = None) -> None:
        self.port = port
        self._workdir = workdir or Path(tempfile.gettempdir())
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--daemonize", "no", "--dir", str(self._workdir)]  # fmt: skip
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20  # a loaded CI box starts slowly
        while True:
            try:
                with self.client() as client:
                    client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.02)

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=self.port, **{"socket_timeout": 5.0, **kwargs})  # type: ignore[arg-type]

    def kill(self) -> None:
        """kill -9: no goodbye to clients, nothing kept."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=10)
            self._process = None

    def restart(self) -> None:
        """A fresh, empty Redis on the same port (scripts and counters gone)."""
        self.kill()
        self.start()

    def pause(self) -> None:
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop for good; a paused server is ended too (SIGKILL needs no resume)."""
        self.kill()


@contextmanager
def redis_servers(count: int, workdir: Path, first_port: int = PORTS[0]) -> Iterator[list[RedisServer]]:
    servers = [RedisServer(first_port + i, workdir) for i in range(count)]
    try:
        yield [server.start() for server in servers]
    finally:
        for server in servers:
            server.kill()  # SIGKILL ends a paused (SIGSTOP) server too
