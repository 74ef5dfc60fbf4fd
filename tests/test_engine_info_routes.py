"""The engine server's routes besides generation, against vLLM's: /ping, /version, /v1/models' card fields,
POST /detokenize (info_routes.py); the model is the deterministic fake."""

import time

import fake_engine_server
import httpx
import pytest
from test_engine_serving_fakes import VOCAB

server, client = fake_engine_server.server, fake_engine_server.client  # the fixtures


def test_ping_answers_like_health(server) -> None:
    assert httpx.get(f"{server[0]}/ping").status_code == 200
    assert httpx.post(f"{server[0]}/ping").status_code == 200


def test_version(server) -> None:
    reply = httpx.get(f"{server[0]}/version")
    assert reply.status_code == 200
    assert isinstance(reply.json()["version"], str) and reply.json()["version"]


def test_the_model_card_has_vllms_fields(server) -> None:
    card = httpx.get(f"{server[0]}/v1/models").json()["data"][0]
    assert card["id"] == "fake" and card["object"] == "model" and card["owned_by"] == "llmgw"
    assert card["max_model_len"] == 128
    assert card["root"] == "/models/fake.gguf" and card["parent"] is None
    assert time.time() - 3600 < card["created"] <= time.time()  # the server's start, not 0


def test_detokenize_turns_ids_into_text(server) -> None:
    reply = httpx.post(f"{server[0]}/detokenize", json={"model": "fake", "tokens": [5, 6, 7]})
    assert reply.status_code == 200 and reply.json() == {"prompt": "<5><6><7>"}
    without_model = httpx.post(f"{server[0]}/detokenize", json={"tokens": []})
    assert without_model.json() == {"prompt": ""}


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "fake", "tokens": [1, VOCAB]}, 400, "tokens"),
        ({"model": "fake", "tokens": [-1]}, 400, "tokens"),
        ({"model": "fake", "tokens": ["a"]}, 400, "tokens"),
        ({"model": "fake", "tokens": "abc"}, 400, "tokens"),
        ({"model": "fake"}, 400, "tokens"),
        ({"model": "fake", "tokens": [1], "extra": 1}, 400, "extra"),
        ({"model": "other", "tokens": [1]}, 404, "model"),
    ],
)
def test_detokenize_refusals_are_openai_shaped(server, body, status: int, param: str) -> None:
    reply = httpx.post(f"{server[0]}/detokenize", json=body)
    assert reply.status_code == status
    assert reply.json()["error"]["param"] == param
