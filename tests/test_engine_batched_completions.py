"""Completions take a batch of prompts (strings or token-id arrays): n choices each, index = prompt × n + choice,
usage summed over the prompts (each counted once); streamed or not. Fake model over real HTTP."""

import fake_engine_server
import httpx
import orjson
import pytest
from fake_engine_server import fake_load

server = fake_engine_server.server  # the fixture

ENCODE = fake_load().model.encode_text


def _complete(server, **body) -> dict:
    response = httpx.post(f"{server[0]}/v1/completions", json={"model": "fake", "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()


def _stream(server, **body) -> list[dict]:
    body = {
        "model": "fake",
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **body,
    }
    with httpx.stream("POST", f"{server[0]}/v1/completions", json=body) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


def _alone(server, prompt, max_tokens: int) -> str:
    return _complete(server, prompt=prompt, max_tokens=max_tokens)["choices"][0]["text"]


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("prompts", [["The sky is", "Two plus two is"], [[5, 6, 7], [8], [9, 10]]])
def test_a_batch_gives_n_choices_per_prompt_in_order(server, prompts, n):
    reply = _complete(server, prompt=prompts, n=n, max_tokens=3)
    choices = reply["choices"]
    assert [c["index"] for c in choices] == list(range(len(prompts) * n))
    for index, choice in enumerate(choices):  # greedy: each choice is its prompt's answer alone
        assert choice["text"] == _alone(server, prompts[index // n], 3)
        assert choice["finish_reason"] == "length"
    lengths = [len(ENCODE(p)) if isinstance(p, str) else len(p) for p in prompts]
    usage = reply["usage"]
    assert usage["prompt_tokens"] == sum(lengths)  # each prompt once, whatever n
    assert usage["completion_tokens"] == 3 * len(prompts) * n
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("n", [1, 2])
def test_a_streamed_batch_interleaves_its_choices_by_index(server, n):
    prompts = ["The sky is", [5, 6, 7], "Two plus two is"]
    chunks = _stream(server, prompt=prompts, n=n, max_tokens=3)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert sorted(texts) == list(range(len(prompts) * n))
    assert all(texts[i] == _alone(server, prompts[i // n], 3) for i in texts)
    assert finishes == dict.fromkeys(texts, "length")
    assert len({c["id"] for c in chunks}) == 1
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert usage["prompt_tokens"] == len(ENCODE("The sky is")) + 3 + len(ENCODE("Two plus two is"))
    assert usage["completion_tokens"] == 3 * len(prompts) * n


def test_a_batch_with_echo_echoes_each_prompt(server):
    reply = _complete(server, prompt=["ab", [5, 6]], n=2, max_tokens=1, echo=True)
    texts = [c["text"] for c in reply["choices"]]
    assert texts[0].startswith("ab") and texts[1].startswith("ab")
    assert texts[2].startswith("<5><6>") and texts[3].startswith("<5><6>")


def test_a_batch_whose_prompt_is_too_long_is_one_400_and_frees_everything(server):
    _, app = server
    engine = app.state.engine_state.loaded.engine.engine
    response = httpx.post(
        f"{server[0]}/v1/completions", json={"model": "fake", "prompt": ["ok", "x" * 200], "max_tokens": 2}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert engine.num_requests == 0
