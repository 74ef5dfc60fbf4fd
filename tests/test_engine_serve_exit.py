"""`llmgw engine serve` exits with status 1 when the model fails to load (as vLLM's server exits when its
engine cannot start), after logging the cause once and answering /health with 503 engine_load_failed for a
short grace, so the gateway's supervisor (backends/local.py) still learns the kind of failure."""

import logging
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from backends.local_engine.server.serve import serve
from backends.local_engine.server.served import LoadedEngine


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_failed_load_exits_1_after_a_grace_that_says_why(caplog: pytest.LogCaptureFixture) -> None:
    port = _free_port()
    answers: list[tuple[int, str]] = []

    def broken_load() -> LoadedEngine:
        time.sleep(0.3)
        raise FileNotFoundError("/nonexistent/sk-secret/model.gguf")

    def poll() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                answers.append((reply.status_code, reply.json()["error"]["code"]))
            except httpx.TransportError:
                if answers:  # it answered, then went away: the process has exited
                    return
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="llmgw.engine"):
        status = serve(broken_load, "127.0.0.1", port, "warning", failed_load_grace_s=1.0)
    poller.join(5)
    assert status == 1
    assert 1.0 <= time.monotonic() - started < 15
    assert (503, "engine_load_failed") in answers
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1 and tracebacks[0].exc_info[0] is FileNotFoundError
    assert any("exiting with status 1" in r.getMessage() for r in caplog.records)


def test_the_command_exits_non_zero_when_the_model_file_is_missing() -> None:
    command = [sys.executable, "-m", "backends.local_engine.cli", "serve", "--port", str(_free_port()),
               "--model", "/nonexistent/model.gguf"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert done.stderr.count("Traceback") == 1 and "FileNotFoundError" in done.stderr
