"""The engine's OpenAI server on a free loopback port over the deterministic fake model; fixtures for the
engine-server tests (`server`: (base URL, app); `client`: the official SDK pointed at it)."""

import threading
import time

import httpx
import openai
import pytest
import uvicorn
from test_engine_serving_fakes import VOCAB, FakeDetokenizer, FakeRunner, fake_probs

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.async_engine import AsyncEngine
from backends.local_engine.engine.llm_engine import LLMEngine
from backends.local_engine.loading.chat_template import ChatTemplate
from backends.local_engine.server.metrics import EngineMetrics
from backends.local_engine.server.served import LoadedEngine, ServedModel
from backends.local_engine.server.server import create_app


def fake_load(probs=fake_probs, vocab_size: int | None = None, **settings) -> LoadedEngine:  # noqa: ANN001, ANN003
    """`probs`, `vocab_size`, `settings`: what a test changes in the fake engine (EngineSettings fields)."""
    settings = EngineSettings(
        **{"max_model_len": 128, "max_num_batched_tokens": 32, "max_num_seqs": 4, **settings}
    )
    engine = LLMEngine(settings, FakeRunner(num_blocks=64), probs, FakeDetokenizer, vocab_size=vocab_size)
    metrics = EngineMetrics(engine, "fake")

    def encode_text(text: str) -> list[int]:
        return [1 + ord(c) % 50 for c in text]

    def encode_chat(messages: list[dict], **options) -> list[int]:
        if messages[0]["role"] == "assistant":  # as Gemma's template does
            raise ValueError("chat template: Conversation roles must alternate user/assistant/user/...")
        if options:  # the server passed template options: render them with the real template
            return encode_text(ChatTemplate(None, "", "").render(messages, **options))
        return encode_text("".join(m["content"] for m in messages))

    model = ServedModel(
        "fake",
        encode_text,
        encode_chat,
        lambda t: f"<{t}>",
        vocab_size=VOCAB,
        decode=lambda ids: "".join(f"<{t}>" for t in ids),
        root="/models/fake.gguf",
    )
    return LoadedEngine(AsyncEngine(engine, metrics), model, metrics)


@pytest.fixture(scope="module")
def server():
    app = create_app(fake_load)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.01)
    port = srv.servers[0].sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    while httpx.get(f"{base}/health").status_code != 200:
        time.sleep(0.01)
    yield base, app
    srv.should_exit = True
    thread.join(5)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0)
