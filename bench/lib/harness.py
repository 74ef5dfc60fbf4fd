"""Shared benchmark plumbing: start servers as child processes, drive them with wrk, read their CPU time."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
# SmolLM2's tokenizer as an HF cache, for AIPerf (bench/lib/trace_aiperf)
HF_CACHE = ROOT / "build" / "hf-cache"
WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
done = function(summary, latency, requests)
  io.write(string.format('{"requests": %%d, "errors": %%d, "duration_us": %%d, "p50_us": %%d, "p99_us": %%d, "non2xx": %%d}\\n',
    summary.requests, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99), summary.errors.status))
end
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


@dataclass
class Process:
    popen: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(timeout=10)


def start_fake_upstream() -> Process:
    port = free_port()
    code = (
        f"import sys, uvicorn; sys.path.insert(0, {str(ROOT)!r}); from tests.fakes import FakeUpstream; "
        f"uvicorn.run(FakeUpstream(), host='127.0.0.1', port={port}, log_level='warning', loop='uvloop', "
        "http='httptools')"
    )
    popen = subprocess.Popen([sys.executable, "-c", code])
    wait_for_port(port)
    return Process(popen, port)


def start_gateway(config: dict[str, Any], env: dict[str, str] | None = None) -> Process:
    port = free_port()
    path = Path(tempfile.mkstemp(suffix=".yaml")[1])
    path.write_text(yaml.safe_dump(config))
    child_env = {**os.environ, "LLMGW_CONFIG_FILE": str(path), "LLMGW_LOG_LEVEL": "warning", **(env or {})}
    command = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    popen = subprocess.Popen(command, env=child_env, stdout=subprocess.DEVNULL)  # stdout: the access log
    wait_for_port(port)
    return Process(popen, port)


def wrk(url: str, body: bytes, key: str, connections: int, seconds: float) -> dict[str, Any]:
    if not shutil.which("wrk"):
        raise SystemExit("wrk is missing: apt-get install -y wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT % (body.decode(), key))
    command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", script.name, url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def write_json(name: str, payload: Any) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path
