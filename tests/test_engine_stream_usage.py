"""vLLM's stream_options.continuous_usage_stats on the engine server: with include_usage, every streamed chunk
carries the usage so far (prompt_tokens, completion_tokens, total_tokens), chat and completions; without it
chunks carry usage null and only the last chunk counts. Fake model over real HTTP: the prompt "a" is 1 token
(the chat messages' contents are encoded alone), and each step writes one token."""

from typing import Any

import fake_engine_server
import httpx
import orjson
import pytest

server = fake_engine_server.server  # the fixture

BODIES = {
    "chat/completions": {"model": "fake", "messages": [{"role": "user", "content": "a"}], "temperature": 0},
    "completions": {"model": "fake", "prompt": "a", "temperature": 0},
}


def _stream(server, endpoint: str, **extra: Any) -> list[dict[str, Any]]:
    body = {**BODIES[endpoint], "stream": True, "max_tokens": 4, **extra}
    with httpx.stream("POST", f"{server[0]}/v1/{endpoint}", json=body) as response:
        assert response.status_code == 200, response.read()
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


def _counts(usage: dict[str, Any]) -> tuple[int, int, int]:
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_continuous_usage_is_on_every_chunk(server, endpoint: str) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = _stream(server, endpoint, stream_options=options)
    *answer, last = chunks
    assert all(
        set(chunk["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"} for chunk in answer
    )
    generated = [_counts(c["usage"]) for c in answer if c["choices"][0].get("delta", {}).get("role") is None]
    assert generated == [(1, 1, 2), (1, 2, 3), (1, 3, 4), (1, 4, 5)]
    if endpoint == "chat/completions":  # the opening chunk (the role): the prompt alone
        assert answer[0]["choices"][0]["delta"]["role"] == "assistant"
        assert _counts(answer[0]["usage"]) == (1, 0, 1)
    assert last["choices"] == [] and _counts(last["usage"]) == (1, 4, 5)


@pytest.mark.parametrize("endpoint", list(BODIES))
@pytest.mark.parametrize(
    "options",
    [{"include_usage": True}, {"include_usage": True, "continuous_usage_stats": False},
     {"include_usage": False, "continuous_usage_stats": True}],
)  # fmt: skip
def test_without_continuous_usage_only_the_last_chunk_counts(server, endpoint: str, options: dict) -> None:
    chunks = _stream(server, endpoint, stream_options=options)
    if options["include_usage"]:
        *answer, last = chunks
        assert all(chunk["usage"] is None for chunk in answer)
        assert _counts(last["usage"]) == (1, 4, 5)
    else:
        assert all("usage" not in chunk for chunk in chunks)


def test_continuous_usage_counts_each_choice_of_n(server) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = _stream(server, "completions", n=2, max_tokens=3, stream_options=options)
    per_choice: dict[int, list[int]] = {}
    for chunk in chunks[:-1]:
        per_choice.setdefault(chunk["choices"][0]["index"], []).append(chunk["usage"]["completion_tokens"])
    assert per_choice == {0: [1, 2, 3], 1: [1, 2, 3]}
    assert _counts(chunks[-1]["usage"]) == (1, 6, 7)  # the last chunk: the whole request, as without
