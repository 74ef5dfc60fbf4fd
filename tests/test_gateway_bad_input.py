"""Every bad input gets an OpenAI-style 4xx error, never a 500 or a hang."""

import logging
import socket
import time

import httpx
import orjson
import pytest

from tests.conftest import MASTER_KEY
from tests.fakes import FakeUpstream, ServerThread

AUTH = {"authorization": f"Bearer {MASTER_KEY}"}
GOOD = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def post(gateway: ServerThread, payload: bytes | dict, headers: dict | None = None) -> httpx.Response:
    content = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return httpx.post(
        gateway.url + "/v1/chat/completions", content=content, headers={**AUTH, **(headers or {})}, timeout=10
    )


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert response.headers["x-request-id"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"", None),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": 7, "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "fake-model", "messages": []}, "messages"),
        ({"model": "fake-model", "messages": "hi"}, "messages"),
        ({"model": "fake-model", "messages": [{"role": "wizard", "content": "x"}]}, "messages.[0].role"),
        ({"model": "fake-model", "messages": [{"role": "user"}]}, "messages.[0].content"),
        ({"model": "fake-model", "messages": [{"role": "user", "content": 5}]}, "messages.[0]"),
        ({**GOOD, "temperature": 3}, "temperature"),
        ({**GOOD, "temperature": "hot"}, "temperature"),
        ({**GOOD, "max_tokens": 0}, "max_tokens"),
        ({**GOOD, "max_tokens": True}, "max_tokens"),
        ({**GOOD, "stream": "yes"}, "stream"),
        ({**GOOD, "stop": [f"s{i}" for i in range(65)]}, "stop"),
        ({**GOOD, "stop": ["a", 1]}, "stop"),
        ({**GOOD, "n": 129}, "n"),
        ({**GOOD, "logit_bias": [1, 2]}, "logit_bias"),
        ({**GOOD, "logit_bias": {"hello": 1}}, "logit_bias"),
        ({**GOOD, "logit_bias": {"-5": 1}}, "logit_bias"),
        ({**GOOD, "logit_bias": {"12345678901": 1}}, "logit_bias"),
        ({**GOOD, "logit_bias": {"42": -101}}, "logit_bias"),
        ({**GOOD, "logit_bias": {"42": "up"}}, "logit_bias"),
        ({**GOOD, "tool_choice": "required"}, "tool_choice"),
        ({**GOOD, "stream_options": {"include_usage": True}}, "stream_options"),
        ({**GOOD, "repetition_penalty": 0}, "repetition_penalty"),
        ({**GOOD, "tools": {"type": "function"}}, "tools"),
        (
            {**GOOD, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools[0].function.name",
        ),
        ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "tools[1].function.name"),
        ({**GOOD, "tools": [{"type": "custom", "custom": {"name": ""}}]}, "tools[0].custom.name"),
    ],
)
def test_bad_chat_bodies_are_400(gateway: ServerThread, payload: bytes | dict, param: str | None) -> None:
    assert_openai_error(post(gateway, payload), 400, param)


def test_unknown_model_is_404(gateway: ServerThread) -> None:
    error = assert_openai_error(post(gateway, {**GOOD, "model": "gpt-17"}), 404, "model")
    assert error["code"] == "model_not_found"


def test_oversize_body_is_413(gateway: ServerThread) -> None:
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * 100_000}]}
    assert_openai_error(post(gateway, big), 413)


def test_oversize_body_without_content_length_is_413(gateway: ServerThread) -> None:
    def chunks():
        for _ in range(100):
            yield b" " * 1024

    response = httpx.post(gateway.url + "/v1/chat/completions", content=chunks(), headers=AUTH, timeout=10)
    assert_openai_error(response, 413)


@pytest.mark.parametrize("payload", [GOOD, {}, b"{not json"])
@pytest.mark.parametrize("key", [None, "sk-not-a-key"])
def test_no_valid_key_is_401_whatever_the_body(
    gateway: ServerThread, payload: dict | bytes, key: str | None
) -> None:
    kwargs = {"content": payload} if isinstance(payload, bytes) else {"json": payload}
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    response = httpx.post(gateway.url + "/v1/chat/completions", headers=headers, timeout=10, **kwargs)
    code = assert_openai_error(response, 401)["code"]
    assert code == ("missing_api_key" if key is None else "invalid_api_key") and "sk-not" not in response.text
    answer = httpx.post(gateway.url + "/v1/responses", headers=headers, timeout=10, **kwargs)
    assert_openai_error(answer, 401)
    anthropic = {} if key is None else {"x-api-key": key}
    message = httpx.post(gateway.url + "/v1/messages", headers=anthropic, timeout=10, **kwargs)
    assert message.status_code == 401 and message.json()["error"]["type"] == "authentication_error"


def requests_total(gateway: ServerThread, status: str) -> float:
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("llmgw_requests_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if f'status="{status}"' in line)


def test_requests_refused_before_the_pipeline_are_counted(gateway: ServerThread) -> None:
    before = {status: requests_total(gateway, status) for status in ("400", "401", "413")}
    assert post(gateway, b"{not json").status_code == 400
    assert post(gateway, GOOD, {"authorization": "Bearer sk-not-a-key"}).status_code == 401
    assert httpx.post(gateway.url + "/v1/chat/completions", json=GOOD, timeout=10).status_code == 401
    assert post(gateway, b"x" * (64 * 1024 + 1)).status_code == 413
    for path in ("/v1/responses", "/v1/messages"):  # the translated APIs: a malformed body, a bad key
        assert (
            httpx.post(gateway.url + path, content=b"{not json", headers=AUTH, timeout=10).status_code == 400
        )
        assert (
            httpx.post(gateway.url + path, json={}, headers={"x-api-key": "sk-no"}, timeout=10).status_code
            == 401
        )
    after = {status: requests_total(gateway, status) for status in ("400", "401", "413")}
    assert {s: after[s] - before[s] for s in after} == {"400": 3, "401": 4, "413": 1}


def test_models_needs_key(gateway: ServerThread) -> None:
    assert_openai_error(httpx.get(gateway.url + "/v1/models", timeout=10), 401)


def test_unknown_route_and_method(gateway: ServerThread) -> None:
    assert_openai_error(httpx.get(gateway.url + "/v1/nothing", timeout=10), 404)
    assert_openai_error(httpx.get(gateway.url + "/v1/chat/completions", headers=AUTH, timeout=10), 405)


def test_embeddings_without_input_is_400(gateway: ServerThread) -> None:
    response = httpx.post(
        gateway.url + "/v1/embeddings", json={"model": "fake-model"}, headers=AUTH, timeout=10
    )
    assert_openai_error(response, 400, "input")


def test_health(gateway: ServerThread) -> None:
    assert httpx.get(gateway.url + "/health/live").status_code == 200
    ready = httpx.get(gateway.url + "/health/ready").json()
    assert ready["ready"] is True and ready["deployments"] == {"fake-1": True}


def test_client_disconnect_cancels_upstream(
    gateway: ServerThread, upstream: tuple[FakeUpstream, ServerThread], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.access")
    fake = upstream[0]
    before = len(fake.requests)
    body = orjson.dumps(
        {**GOOD, "stream": True, "messages": [{"role": "user", "content": "slow-stream " + "w " * 200}]}
    )
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {MASTER_KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(request)
        assert b"200 OK" in sock.recv(4096)
    time.sleep(1.0)
    assert len(fake.requests) == before + 1
    assert fake.cancelled == 1, "the upstream stream should have been cut when the client left"
    [record] = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "llmgw.access"]
    assert record["status"] == "cancelled" and record["completion_tokens"] >= 1
    assert record["prompt_tokens"] >= 100, (
        "a stream cut short before its usage still bills its prompt (estimate)"
    )
