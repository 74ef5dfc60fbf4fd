"""The engine server's parameters beyond one plain answer (n choices, batched prompts, echo and prompt
logprobs, min_tokens) and what it refuses rather than ignore; official SDK over real HTTP, fake model."""

import time

import fake_engine_server
import httpx
import pytest
import torch
from test_engine_serving_fakes import VOCAB

server, client = fake_engine_server.server, fake_engine_server.client  # the fixtures


def test_n_choices_share_one_prompt_and_sum_their_completion_tokens(client):
    def ask(seed):
        return client.completions.create(model="fake", prompt="abcdefgh", max_tokens=5, n=3, seed=seed,
                                         temperature=1.5, extra_body={"ignore_eos": True})  # fmt: skip

    reply = ask(7)
    assert [c.index for c in reply.choices] == [0, 1, 2] and all(
        c.finish_reason == "length" for c in reply.choices
    )
    assert reply.usage.prompt_tokens == 8 and reply.usage.completion_tokens == 15
    assert len({c.text for c in reply.choices}) > 1  # seeds 7, 8, 9: different draws
    assert [c.text for c in ask(7).choices] == [c.text for c in reply.choices]  # and each reproducible
    greedy = client.completions.create(model="fake", prompt="abcdefgh", max_tokens=5, n=2, temperature=0)
    assert greedy.choices[0].text == greedy.choices[1].text


def test_n_choices_stream_interleaved_with_one_usage_chunk(client):
    messages = [{"role": "user", "content": "abc"}]
    stream = client.chat.completions.create(model="fake", messages=messages, max_tokens=4, n=2, stream=True,
                                            stream_options={"include_usage": True}, seed=7)  # fmt: skip
    # seeded: unseeded, a choice sampled EOS first (p ~ 0.8 %) now and then, and its empty text failed the test
    texts, finishes, roles, usage = {0: "", 1: ""}, {}, set(), None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            roles |= {choice.index} if choice.delta.role == "assistant" else set()
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert roles == {0, 1} and set(finishes) == {0, 1} and all(texts.values())
    assert usage.completion_tokens == sum(t.count("<") for t in texts.values()) and usage.prompt_tokens == 3


def test_a_batch_of_prompts_gives_n_choices_each_in_prompt_order(client):
    reply = client.completions.create(model="fake", prompt=["ab", "cdef", [7, 8, 9]], max_tokens=2, n=2, temperature=0,
                                      echo=True)  # fmt: skip
    assert [c.index for c in reply.choices] == list(range(6))
    assert [c.text.split("<")[0] for c in reply.choices] == ["ab", "ab", "cdef", "cdef", "", ""]
    assert reply.choices[4].text.startswith("<7><8><9>")
    assert reply.usage.prompt_tokens == 2 + 4 + 3 and reply.usage.completion_tokens == 12
    single = client.completions.create(model="fake", prompt="cdef", max_tokens=2, temperature=0)
    assert reply.choices[2].text == "cdef" + single.choices[0].text  # each prompt answered as if alone


@pytest.mark.parametrize("prompt", [[], [[]], [1, "a"], [["a"]], ["ok", "x" * 200]])
def test_a_bad_batch_is_a_400_and_starts_nothing(server, prompt):
    base, app = server
    engine = app.state.engine_state.loaded.engine.engine
    response = httpx.post(f"{base}/v1/completions", json={"model": "fake", "prompt": prompt, "max_tokens": 2})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    for _ in range(100):
        if engine.num_requests == 0:
            break
        time.sleep(0.01)
    assert engine.num_requests == 0 and engine.block_manager.num_free_blocks == 64


def test_echo_returns_the_prompt_before_the_answer_streamed_or_not(client):
    reply = client.completions.create(model="fake", prompt="abc", max_tokens=2, temperature=0, echo=True, n=2)
    assert all(c.text.startswith("abc<") for c in reply.choices)
    pieces = [c.choices[0].text for c in client.completions.create(
        model="fake", prompt="abc", max_tokens=2, temperature=0, echo=True, stream=True) if c.choices]  # fmt: skip
    assert (
        pieces[0].startswith("abc<") and "".join(pieces) == reply.choices[0].text
    )  # the echo leads the first
    ids = client.completions.create(model="fake", prompt=[5, 6], max_tokens=1, temperature=0, echo=True)
    assert ids.choices[0].text.startswith("<5><6>")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"best_of": 3}, "best_of"),
        ({"suffix": "tail"}, "suffix"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
    ],
)
def test_what_the_engine_cannot_honour_is_refused_not_ignored(server, extra, param):
    body = {"model": "fake", "prompt": "abc", "max_tokens": 2, **extra}
    response = httpx.post(f"{server[0]}/v1/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_echo_with_logprobs_scores_every_prompt_token_across_chunks(server, client):
    _, app = server
    prompt = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"  # 40 tokens: two 32-token prefill chunks
    client.completions.create(
        model="fake", prompt=prompt, max_tokens=1, temperature=0
    )  # now in the prefix cache
    reply = client.completions.create(
        model="fake", prompt=prompt, max_tokens=2, temperature=0, echo=True, logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert reply.choices[0].text.startswith(prompt) and len(logprobs.tokens) == 40 + 2
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(isinstance(x, float) and x <= 0 for x in logprobs.token_logprobs[1:])
    assert all(len(top) == 2 for top in logprobs.top_logprobs[1:])
    assert reply.usage.prompt_tokens_details.cached_tokens == 0  # computed whole, not taken from the cache
    # the fake model: token t+1 after t gets logit 3, every other one linspace(0, 1): check one by hand
    ids = [1 + ord(c) % 50 for c in prompt]
    row = torch.linspace(0.0, 1.0, VOCAB)
    row[1 + (ids[4] * 5 + 3) % 13] = 3.0
    assert logprobs.token_logprobs[5] == pytest.approx(float(torch.log_softmax(row, 0)[ids[5]]), abs=1e-5)
    first, second = map(len, logprobs.tokens[:2])
    assert logprobs.text_offset[:3] == [0, first, first + second]  # counted from the start of the echo
    streamed = [c.choices[0] for c in client.completions.create(
        model="fake", prompt=prompt, max_tokens=2, temperature=0, echo=True, logprobs=2, stream=True) if c.choices]  # fmt: skip
    assert streamed[0].logprobs.token_logprobs[:6] == logprobs.token_logprobs[:6]


def test_min_tokens_keeps_going_past_a_stop_token(client):
    first = client.completions.create(model="fake", prompt="abc", max_tokens=1, temperature=0).choices[0].text
    stop_id = int(first.strip("<>"))  # the fake's greedy first token
    kwargs = {"model": "fake", "prompt": "abc", "max_tokens": 6, "temperature": 0}
    assert (
        client.completions.create(**kwargs, extra_body={"stop_token_ids": [stop_id]}).usage.completion_tokens
        == 1
    )
    held = client.completions.create(**kwargs, extra_body={"stop_token_ids": [stop_id], "min_tokens": 3})
    assert held.usage.completion_tokens >= 3


def test_tokenize_counts_as_a_request_would(server, client):
    base, _ = server
    counted = httpx.post(
        f"{base}/tokenize", json={"model": "fake", "prompt": "abcd", "return_token_strs": True}
    )
    assert counted.json() == {"count": 4, "max_model_len": 128, "tokens": [1 + ord(c) % 50 for c in "abcd"],
                              "token_strs": [f"<{1 + ord(c) % 50}>" for c in "abcd"]}  # fmt: skip
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": " you"}]}
    ]
    chat = httpx.post(f"{base}/tokenize", json={"messages": messages}).json()
    reply = client.chat.completions.create(model="fake", messages=messages, max_tokens=1)
    assert chat["count"] == reply.usage.prompt_tokens == len(chat["tokens"]) and chat["token_strs"] is None


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, 400, "prompt"),
        ({}, 400, "prompt"),
        ({"prompt": ["a"]}, 400, "prompt"),
        ({"prompt": "a", "add_special_tokens": False}, 400, "add_special_tokens"),
        ({"prompt": "a", "truncate_prompt_tokens": 3}, 400, "truncate_prompt_tokens"),
        ({"messages": "hello"}, 400, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages[0].content"),
        ({"model": "other", "prompt": "a"}, 404, "model"),
    ],
)
def test_tokenize_refuses_what_it_cannot_count(server, body, status, param):
    response = httpx.post(f"{server[0]}/tokenize", json=body)
    assert response.status_code == status and response.json()["error"]["param"] == param
    assert httpx.post(f"{server[0]}/tokenize", content=b"[1").status_code == 400
