"""Bad bodies on /v1/responses and /v1/messages: a 4xx in each API's own error shape, never a 500."""

from typing import Any

import httpx
import pytest

from tests.conftest import MASTER_KEY
from tests.fakes import ServerThread

OPENAI = {"authorization": f"Bearer {MASTER_KEY}"}
ANTHROPIC = {"x-api-key": MASTER_KEY, "anthropic-version": "2023-06-01"}
M = "fake-model"
USER = [{"role": "user", "content": "x"}]

RESPONSES: list[Any] = [
    b"{nope", b"[]", {"model": M}, {"input": "x"}, {"model": M, "input": 5}, {"model": M, "input": []},
    {"model": M, "input": [5]}, {"model": M, "input": [{"type": "mystery"}]},
    {"model": M, "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
    {"model": M, "input": [{"role": "user", "content": [7]}]},
    {"model": M, "input": [{"type": "function_call_output", "output": "x"}]},
    {"model": M, "input": "x", "instructions": 3}, {"model": M, "input": "x", "tools": "all"},
    {"model": M, "input": "x", "tools": [{"type": "function"}]}, {"model": M, "input": "x", "tool_choice": 3},
    {"model": M, "input": "x", "text": {"format": "json"}}, {"model": M, "input": "x", "text": {"format": {"type": "json_schema"}}},
    {"model": M, "input": "x", "max_output_tokens": 0}, {"model": M, "input": "x", "background": True},
    {"model": M, "input": "x", "previous_response_id": 5}, {"model": M, "input": "x", "previous_response_id": "resp_none"},
    {"model": M, "input": "x", "stream": "yes"},
]  # fmt: skip
MESSAGES: list[Any] = [
    b"{nope", b"[]", {"model": M, "messages": USER}, {"model": M, "max_tokens": 5}, {"max_tokens": 5, "messages": USER},
    {"model": M, "max_tokens": "5", "messages": USER}, {"model": M, "max_tokens": 0, "messages": USER},
    {"model": M, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
    {"model": M, "max_tokens": 5, "messages": [{"role": "user"}]},
    {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
    {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [3]}]},
    {"model": M, "max_tokens": 5, "messages": USER, "system": [1]},
    {"model": M, "max_tokens": 5, "messages": USER, "tools": [{"type": "web_search_20250305"}]},
    {"model": M, "max_tokens": 5, "messages": USER, "tool_choice": "auto"},
    {"model": M, "max_tokens": 5, "messages": USER, "stop_sequences": [f"s{i}" for i in range(65)]},
    {"model": M, "max_tokens": 5, "messages": USER, "frobnicate": 1},
    {"model": M, "max_tokens": 5, "messages": USER, "temperature": 9},
]  # fmt: skip


def post(url: str, payload: Any, headers: dict[str, str]) -> httpx.Response:
    content = payload if isinstance(payload, bytes) else httpx.Request("POST", url, json=payload).content
    return httpx.post(
        url, content=content, headers={**headers, "content-type": "application/json"}, timeout=30
    )


@pytest.mark.parametrize("payload", RESPONSES)
def test_responses_bad_input_is_an_openai_4xx(gateway: ServerThread, payload: Any) -> None:
    response = post(gateway.url + "/v1/responses", payload, OPENAI)
    assert 400 <= response.status_code < 500, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("payload", MESSAGES)
def test_messages_bad_input_is_an_anthropic_4xx(gateway: ServerThread, payload: Any) -> None:
    response = post(gateway.url + "/v1/messages", payload, ANTHROPIC)
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["message"]


def test_oversize_bodies_are_413_in_both_shapes(gateway: ServerThread) -> None:
    big = {"model": M, "input": "x" * 70_000}
    assert post(gateway.url + "/v1/responses", big, OPENAI).status_code == 413
    answer = post(gateway.url + "/v1/messages", {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 70_000}]}, ANTHROPIC)  # fmt: skip
    assert answer.status_code == 413 and answer.json()["error"]["type"] == "request_too_large"
