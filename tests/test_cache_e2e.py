"""The caches through the real app and the official openai SDK: headers, streaming replay, isolation."""

from collections.abc import Iterator

import httpx
import openai
import pytest

from gateway.app import create_app
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import FakeUpstream, ServerThread

ADMIN_TOKEN = "admin-test-token"


@pytest.fixture(scope="module")
def cached_gateway(upstream: tuple[FakeUpstream, ServerThread]) -> Iterator[ServerThread]:
    settings = gateway_settings(
        upstream[1].url,
        cache={"semantic_enabled": True, "onnx": False, "defaults": {"semantic": "static"}},
        admin_token=ADMIN_TOKEN,
    )
    with ServerThread(create_app(settings)) as server:
        yield server


@pytest.fixture
def client(cached_gateway: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=cached_gateway.url + "/v1", api_key=MASTER_KEY, max_retries=0)


def ask(client: openai.OpenAI, question: str, **extra: object) -> tuple[str, dict[str, str]]:
    messages = [{"role": "user", "content": question}]
    response = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=messages, temperature=0, **extra
    )
    return response.parse().choices[0].message.content, dict(response.headers)


def test_repeat_is_an_exact_hit_and_upstream_is_not_called(client: openai.OpenAI, upstream: tuple) -> None:
    first, headers = ask(client, "How tall is Mount Kilimanjaro?")
    calls = len(upstream[0].requests)
    second, again = ask(client, "How tall is Mount Kilimanjaro?")
    assert headers["x-cache-status"] == "miss" and again["x-cache-status"] == "hit"
    assert first == second and len(upstream[0].requests) == calls
    assert "x-served-by" not in again


def test_paraphrase_is_a_semantic_hit_and_a_hard_negative_is_not(client: openai.OpenAI) -> None:
    ask(client, "What is the capital city of Australia?")
    answer, headers = ask(client, "Can you tell me the capital city of Australia?")
    assert headers["x-cache-status"] == "semantic-hit" and float(headers["x-cache-similarity"]) > 0.6
    assert answer == "echo: What is the capital city of Australia?"
    other, headers = ask(client, "What is the capital city of Austria?")
    assert headers["x-cache-status"] == "miss" and "Austria" in other


def test_a_language_constraint_is_not_answered_from_the_plain_question(client: openai.OpenAI) -> None:
    ask(client, "What is the capital of Italy?")
    answer, headers = ask(client, "What is the capital of Italy? Answer in Italian.")
    assert headers["x-cache-status"] == "miss" and "Answer in Italian" in answer


def test_readiness_says_semantic_caching_is_on(cached_gateway: ServerThread) -> None:
    report = httpx.get(cached_gateway.url + "/health/ready").json()
    assert report["cache"] == {"semantic": True, "reason": None}


def test_admin_feedback_evicts_the_semantic_hit_it_names(
    client: openai.OpenAI, cached_gateway: ServerThread
) -> None:
    ask(client, "How many legs does a spider have?")
    _, headers = ask(client, "How many legs do spiders have?")
    assert headers["x-cache-status"] == "semantic-hit"
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    url = cached_gateway.url + "/admin/v1/cache/feedback"
    first = httpx.post(url, json={"request_id": headers["x-request-id"]}, headers=admin)
    again = httpx.post(url, json={"request_id": headers["x-request-id"]}, headers=admin)
    assert first.json()["evicted"] is True and again.json()["evicted"] is False
    empty = httpx.post(url, json={"request_id": ""}, headers=admin)
    assert empty.status_code == 422 and "message" in empty.json()["error"]
    _, after = ask(client, "How many legs do spiders have?")
    assert after["x-cache-status"] == "miss"


def test_streaming_hit_replays_a_stream_the_sdk_parses(client: openai.OpenAI) -> None:
    def stream() -> tuple[str, object, str]:
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": "Name a prime number"}], temperature=0,
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(raw.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks[-1].usage, raw.headers["x-cache-status"]

    first, usage, status = stream()
    replay, replay_usage, replay_status = stream()
    assert (status, replay_status) == ("miss", "hit")
    assert replay == first == "echo: Name a prime number"
    assert replay_usage is not None and replay_usage.completion_tokens == usage.completion_tokens


def test_no_cache_header_bypasses_lookup(client: openai.OpenAI) -> None:
    ask(client, "Spell the word cat")
    _, headers = ask(client, "Spell the word cat", extra_headers={"cache-control": "no-cache"})
    assert headers["x-cache-status"] != "hit"


def test_sampled_requests_are_not_cached_by_default(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Tell me a story"}]
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=messages, temperature=0.9
        )
        assert raw.headers["x-cache-status"] == "bypass"
