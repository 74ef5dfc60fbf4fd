"""The embedded engine backend (backends/local.py) after a failed model load: a prompt 503
`engine_load_failed` in OpenAI's error shape, readiness that says why, and no detail leaked."""

import asyncio
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends import local
from backends.base import UpstreamError
from backends.local import LocalEngineBackend, load_failure_kind
from backends.local_engine.config import EngineSettings
from core.models import DeploymentConfig, ModelConfig
from gateway.app import create_app
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import ServerThread

SECRET_PATH = "/nonexistent/sk-secret-123/model.gguf"
CHAT = {"model": "engine", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def failed_gateway() -> Iterator[ServerThread]:
    """A gateway whose only deployment is the embedded engine with a model file that does not exist."""
    deployment = DeploymentConfig(
        name="engine-1", backend="local_engine", model="smollm2", engine={"model": SECRET_PATH}
    )
    settings = gateway_settings(
        "http://127.0.0.1:9", models=[ModelConfig(name="engine", deployments=[deployment])]
    )
    with ServerThread(create_app(settings)) as server:
        deadline = time.monotonic() + 90  # the engine child imports torch before it finds no file
        while time.monotonic() < deadline:
            report = httpx.get(server.url + "/health/ready", timeout=5).json()
            if "reasons" in report:
                break
            time.sleep(0.2)
        yield server


def test_requests_after_a_failed_load_get_a_prompt_503(failed_gateway: ServerThread) -> None:
    headers = {"authorization": f"Bearer {MASTER_KEY}"}
    for stream in (False, True):
        started = time.monotonic()
        reply = httpx.post(
            failed_gateway.url + "/v1/chat/completions",
            json={**CHAT, "stream": stream},
            headers=headers,
            timeout=10,
        )
        assert time.monotonic() - started < 2.0, "the failure is answered at once, not waited out"
        assert reply.status_code == 503
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "engine_load_failed" and error["type"] == "service_unavailable_error"
        assert "FileNotFoundError" in error["message"] and "still loading" not in error["message"]
        assert "sk-secret" not in reply.text and "nonexistent" not in reply.text


def test_readiness_says_not_ready_and_why(failed_gateway: ServerThread) -> None:
    reply = httpx.get(failed_gateway.url + "/health/ready", timeout=5)
    assert reply.status_code == 503
    report = reply.json()
    assert report["ready"] is False and report["deployments"] == {"engine-1": False}
    assert "FileNotFoundError" in report["reasons"]["engine-1"]
    assert "sk-secret" not in reply.text


@pytest.mark.parametrize(
    ("code", "kind"),
    [(3, "the engine process exited"), (1, "the model failed to load"), (2, "invalid engine settings")],
)
def test_an_engine_process_that_exits_fails_for_good(
    monkeypatch: pytest.MonkeyPatch, code: int, kind: str
) -> None:
    """`engine serve` exits 1 when its model fails to load and 2 on bad settings: the reason names which."""
    spawn = asyncio.create_subprocess_exec

    async def exiting_child(*command: str, env: dict[str, str]) -> Any:
        return await spawn(sys.executable, "-c", f"raise SystemExit({code})")

    monkeypatch.setattr(local.asyncio, "create_subprocess_exec", exiting_child)

    async def scenario() -> None:
        config = DeploymentConfig(name="engine-x", backend="local_engine", model="smollm2")
        backend = LocalEngineBackend(config, EngineSettings(), startup_timeout_s=30)
        await backend.start()
        try:
            with pytest.raises(UpstreamError) as loading:
                await backend.complete("chat", CHAT, "r1")
            assert loading.value.code == "engine_not_ready" and loading.value.retryable
            deadline = time.monotonic() + 20
            while backend.unready_reason() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert backend.unready_reason() == (
                f"The local engine engine-x failed to load ({kind}); see the gateway log."
            )
            with pytest.raises(UpstreamError) as failed:
                await backend.complete("chat", CHAT, "r2")
            assert failed.value.status == 503 and failed.value.code == "engine_load_failed"
            assert not await backend.health()
        finally:
            await backend.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("probe", "kind"),
    [
        ((503, b'{"error":{"message":"The engine failed to load (OSError); see","code":"engine_load_failed"}}'),
         "OSError"),
        ((503, b'{"error":{"message":"no kind here","code":"engine_load_failed"}}'), "unknown error"),
        ((503, b'{"error":{"message":"The engine is not ready.","code":"engine_not_ready"}}'), None),
        ((503, b"not json"), None),
        ((200, b"{}"), None),
        (None, None),
    ],
)  # fmt: skip
def test_load_failure_kind(probe: tuple[int, bytes] | None, kind: str | None) -> None:
    assert load_failure_kind(probe) == kind
