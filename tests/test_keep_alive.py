"""Idle client connections: the gateway keeps them `keep_alive_s` (default 75 s), not uvicorn's 5 s.

Clients pool connections (httpx keeps them 5 s, aiohttp 15 s, load balancers 60 s): a server that closes an
idle one first races the client's next request on it, which then fails with "server disconnected"."""

import json
import socket
import time

from gateway.settings import Settings
from tests.chaos.processes import HTTP_PORTS, Gateway, free_port

REQUEST = b"GET /health/live HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"


def _closed_after(port: int, idle_s: float) -> bool:
    """Whether the gateway closed a kept-alive connection that stayed idle `idle_s` after one request."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(REQUEST)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(idle_s)
        sock.settimeout(0.5)
        try:
            return sock.recv(1) == b""  # end of stream: the server closed it
        except TimeoutError:
            return False  # nothing to read, still open


def test_default_outlasts_common_client_idle_timeouts() -> None:
    assert Settings().keep_alive_s >= 60


def test_the_setting_reaches_the_server(tmp_path) -> None:
    unused = free_port(HTTP_PORTS)  # held by this process, never listened on: a deployment never called
    models = [
        {
            "name": "m",
            "deployments": [{"name": "d", "model": "m", "base_url": f"http://127.0.0.1:{unused}/v1"}],
        }
    ]
    env = {"LLMGW_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/gw.db", "LLMGW_MODELS": json.dumps(models),
           "LLMGW_CACHE__ENABLED": "false", "LLMGW_LOG_LEVEL": "warning"}  # fmt: skip
    short = Gateway({**env, "LLMGW_KEEP_ALIVE_S": "1"}, log_dir=tmp_path).spawn()
    long = Gateway({**env, "LLMGW_KEEP_ALIVE_S": "30", "LLMGW_DATABASE_URL": env["LLMGW_DATABASE_URL"] + "2"},
                   log_dir=tmp_path).spawn()  # fmt: skip
    try:
        short.wait_ready()
        long.wait_ready()
        assert _closed_after(short.port, 1.8)  # uvicorn's default (5 s) would still hold it
        assert not _closed_after(long.port, 6.0)  # past uvicorn's default
    finally:
        short.kill()
        long.kill()
