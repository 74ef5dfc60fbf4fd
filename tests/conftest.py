"""Shared fixtures: a fake upstream and a gateway in front of it, both under uvicorn on free ports."""

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from core.models import DeploymentConfig, ModelConfig
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes import FakeUpstream, ServerThread

if TYPE_CHECKING:
    from cache.encoder import QuestionEncoder
    from cache.verifier import Verifier

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MASTER_KEY = "sk-test-master"


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    fake = FakeUpstream()
    with ServerThread(fake) as server:
        yield fake, server


def fake_models(base_url: str) -> list[ModelConfig]:
    deployment = DeploymentConfig(
        name="fake-1",
        base_url=base_url + "/v1",
        model="upstream-model",
        input_price_per_1m=1.0,
        output_price_per_1m=2.0,
        endpoints=["chat", "completions", "embeddings"],
        read_timeout_s=5,
    )
    return [ModelConfig(name="fake-model", deployments=[deployment])]


def gateway_settings(base_url: str, **overrides: object) -> Settings:
    database = Path(tempfile.mkdtemp(prefix="llmgw-test-")) / "llmgw.db"
    values = {
        "master_key": MASTER_KEY,
        "models": fake_models(base_url),
        "max_body_bytes": 64 * 1024,
        "database_url": f"sqlite+aiosqlite:///{database}",
        "cache": {"semantic_enabled": False},  # the semantic cache has its own tests; MiniLM loads slowly
    }
    return Settings(**{**values, **overrides})


@pytest.fixture(scope="module")
def gateway(upstream: tuple[FakeUpstream, ServerThread]) -> Iterator[ServerThread]:
    with ServerThread(create_app(gateway_settings(upstream[1].url))) as server:
        yield server


@pytest.fixture(scope="module")
def encoder() -> "QuestionEncoder":
    """The semantic cache's question encoder as the gateway builds it by default (the shipped
    calibration was measured with it)."""
    from cache.config import CacheSettings
    from cache.encoder import build_encoder

    return build_encoder(None, threads=1, int8=CacheSettings().onnx_int8)


@pytest.fixture(scope="module")
def verifier() -> "Verifier":
    """The shipped semantic-cache verifier."""
    from cache.verifier import load_verifier

    loaded = load_verifier()
    assert loaded is not None, "the verifier weights ship in cache/verifier_model/"
    return loaded


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the CPU engine kernels (kernels/cpu/ops.py: ~1 min the first time, then cached) before any test
    starts an engine process that would build them under its own start-up timeout."""
    if not any("engine" in item.nodeid or "cpu_kernels" in item.nodeid for item in session.items):
        return
    try:
        from backends.local_engine.kernels.cpu import ops as cpu_kernels
    except ImportError:  # no torch: the engine tests skip themselves
        return
    cpu_kernels.available()
