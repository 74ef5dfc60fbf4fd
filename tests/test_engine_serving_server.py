"""The engine's OpenAI server over real HTTP with the official SDK; the model is the deterministic fake."""

import asyncio
import threading
import time

import httpx
import openai
import pytest
import torch
import uvicorn
from test_engine_serving_fakes import VOCAB, FakeDetokenizer, FakeRunner, fake_probs

from backends.local_engine.async_engine import AsyncEngine
from backends.local_engine.chat_template import ChatTemplate, text_messages
from backends.local_engine.config import EngineSettings
from backends.local_engine.engine import LLMEngine
from backends.local_engine.metrics import EngineMetrics
from backends.local_engine.server import LoadedEngine, ServedModel, create_app


def fake_load() -> LoadedEngine:
    settings = EngineSettings(max_model_len=128, max_num_batched_tokens=32, max_num_seqs=4)
    engine = LLMEngine(settings, FakeRunner(num_blocks=64), fake_probs, FakeDetokenizer)
    metrics = EngineMetrics(engine, "fake")

    def encode_text(text: str) -> list[int]:
        return [1 + ord(c) % 50 for c in text]

    def encode_chat(messages: list[dict], **options) -> list[int]:
        if messages[0]["role"] == "assistant":  # as Gemma's template does
            raise ValueError("chat template: Conversation roles must alternate user/assistant/user/...")
        if options:  # the server passed template options: render them with the real template
            return encode_text(ChatTemplate(None, "", "").render(messages, **options))
        return encode_text("".join(m["content"] for m in messages))

    model = ServedModel("fake", encode_text, encode_chat, lambda t: f"<{t}>", vocab_size=VOCAB)
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


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["fake"]


def test_chat_completion_with_usage(client):
    reply = client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hello"}], max_tokens=5, temperature=0
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content.count("<") == 5
    assert reply.usage.prompt_tokens == 5 and reply.usage.completion_tokens == 5
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_streaming_chat_with_include_usage(client):
    chunks = list(
        client.chat.completions.create(
            model="fake",
            messages=[{"role": "user", "content": "stream me"}],
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.count("<") == 6
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_completions_with_logprobs_and_cached_prefix(client):
    prompt = "a shared system prompt that is long enough to fill blocks " * 2
    client.completions.create(model="fake", prompt=prompt + "one", max_tokens=2, temperature=0)
    reply = client.completions.create(
        model="fake", prompt=prompt + "two", max_tokens=3, temperature=0, logprobs=2
    )
    assert reply.usage.prompt_tokens_details.cached_tokens >= 100
    assert len(reply.choices[0].logprobs.tokens) == 3
    assert all(len(top) == 2 for top in reply.choices[0].logprobs.top_logprobs)


def test_completions_accepts_token_ids(client):
    reply = client.completions.create(model="fake", prompt=[5, 6, 7], max_tokens=2, temperature=0)
    assert reply.usage.prompt_tokens == 3


def test_context_too_long_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="fake", prompt="x" * 200, max_tokens=2)
    body = info.value.body
    assert "maximum context length is 128 tokens" in body["message"]
    assert body["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"temperature": 5}, "temperature"),
        ({"n": 129}, "n"),
        ({"top_logprobs": 3}, "logprobs"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {str(VOCAB): 1}}, "logit_bias"),  # past the vocabulary: only the engine knows
    ],
)
def test_bad_parameters_are_openai_shaped_400s(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "x"}], **kwargs)
    assert info.value.body["param"] == param and info.value.body["type"] == "invalid_request_error"


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
                                            stream_options={"include_usage": True})  # fmt: skip
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


def test_text_content_parts_are_joined_like_a_string(client):
    def ask(content):
        messages = [{"role": "user", "content": content}]
        return client.chat.completions.create(model="fake", messages=messages, max_tokens=4, temperature=0)

    parts = [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]
    as_parts, as_string = ask(parts), ask("hello")
    assert as_parts.usage.prompt_tokens == as_string.usage.prompt_tokens == 5
    assert as_parts.choices[0].message.content == as_string.choices[0].message.content


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        "just a string",
    ],
)
def test_non_text_content_part_is_an_openai_shaped_400(server, part):
    content = [{"type": "text", "text": "what is this?"}, part]
    body = {
        "model": "fake",
        "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": content}],
    }
    response = httpx.post(f"{server[0]}/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == "messages[1].content"
    assert error["code"] == "unsupported_content_type" and "messages[1].content[1]" in error["message"]


def test_text_part_without_text_is_a_400(server):
    body = {"model": "fake", "messages": [{"role": "user", "content": [{"type": "text"}]}]}
    response = httpx.post(f"{server[0]}/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].content[0].text"


def test_conversation_the_template_refuses_is_a_400(server):
    body = {"model": "fake", "messages": [{"role": "assistant", "content": "hi"}]}
    response = httpx.post(f"{server[0]}/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages" and "roles must alternate" in error["message"]


def test_template_renders_joined_parts_not_a_python_literal():
    messages = text_messages([{"role": "user", "content": [{"type": "text", "text": "Q: 2+2?"}]}])
    prompt = ChatTemplate(None, "", "").render(messages)
    assert prompt == "<|im_start|>user\nQ: 2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_a_final_assistant_message_is_continued_and_template_kwargs_reach_the_template():
    messages = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "It is "}]
    prompt = ChatTemplate(None, "", "").render(
        messages, add_generation_prompt=False, continue_final_message=True
    )
    assert prompt == "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\nIt is"
    template = ChatTemplate("{{ 'think' if enable_thinking else 'plain' }}", "", "")
    assert template.render(messages, template_kwargs={"enable_thinking": True}) == "think"
    assert template.render(messages) == "plain"


def test_continue_final_message_through_the_server(server):
    base, _ = server
    body = {"model": "fake", "max_tokens": 2, "temperature": 0, "continue_final_message": True,
            "add_generation_prompt": False}  # fmt: skip
    user = [{"role": "user", "content": "Q?"}]
    ok = httpx.post(
        f"{base}/v1/chat/completions",
        json={**body, "messages": [*user, {"role": "assistant", "content": "A"}]},
    )
    assert ok.status_code == 200
    # the prompt ends in the assistant's text: no end-of-turn, no new assistant header
    full = ChatTemplate(None, "", "").render(
        [*user, {"role": "assistant", "content": "A"}], add_generation_prompt=False
    )
    assert ok.json()["usage"]["prompt_tokens"] == len(full) - len("<|im_end|>\n")
    refused = httpx.post(f"{base}/v1/chat/completions", json={**body, "messages": user})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"


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
        ({"priority": 2}, "priority"),
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


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=1)


def test_malformed_json_is_400(server):
    response = httpx.post(f"{server[0]}/v1/completions", content=b"{not json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def test_metrics_use_vllm_names_with_model_label(server, client):
    client.completions.create(model="fake", prompt="count me", max_tokens=3, temperature=0)
    text = httpx.get(f"{server[0]}/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ):
        lines = [line for line in text.splitlines() if line.startswith(name + "{")]
        assert lines and all('model_name="fake"' in line for line in lines), name
    assert 'vllm:request_success_total{finished_reason="length",model_name="fake"}' in text


@pytest.mark.parametrize("n", [1, 3])
async def test_client_disconnect_aborts_every_choice_and_frees_blocks(server, n):
    base, app = server
    engine = app.state.engine_state.loaded.engine.engine
    body = {
        "model": "fake",
        "prompt": "a long one",
        "max_tokens": 100,
        "stream": True,
        "ignore_eos": True,
        "n": n,
    }
    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", f"{base}/v1/completions", json=body) as response,
    ):
        async for _ in response.aiter_lines():
            break
    for _ in range(200):
        if engine.num_requests == 0 and engine.block_manager.num_free_blocks == 64:
            break
        await asyncio.sleep(0.01)
    assert engine.num_requests == 0
    assert engine.block_manager.num_free_blocks == 64


def test_a_failed_load_says_so_without_its_details():
    from fastapi.testclient import TestClient

    def broken_load() -> LoadedEngine:
        raise ModuleNotFoundError("No module named 'secret-path-sk-123'")

    with TestClient(create_app(broken_load)) as http:
        for _ in range(500):
            reply = http.get("/health")
            if reply.json()["error"]["code"] == "engine_load_failed":
                break
            time.sleep(0.01)
        assert reply.status_code == 503
        assert "ModuleNotFoundError" in reply.json()["error"]["message"]
        assert "sk-123" not in reply.text
        answer = http.post("/v1/completions", json={"model": "fake", "prompt": "x"})
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "engine_load_failed"


def test_health_is_503_until_the_model_is_loaded():
    from fastapi.testclient import TestClient

    release = threading.Event()

    def slow_load() -> LoadedEngine:
        release.wait(10)
        return fake_load()

    with TestClient(create_app(slow_load)) as http:
        assert http.get("/health").status_code == 503
        assert http.post("/v1/completions", json={"model": "fake", "prompt": "x"}).status_code == 503
        release.set()
        for _ in range(500):
            if http.get("/health").status_code == 200:
                break
            time.sleep(0.01)
        assert http.get("/health").status_code == 200
