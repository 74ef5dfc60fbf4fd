"""The engine's OpenAI server over real HTTP with the official SDK; the model is the deterministic fake."""

import asyncio
import threading
import time

import fake_engine_server
import httpx
import openai
import pytest
from fake_engine_server import fake_load
from test_engine_serving_fakes import VOCAB

from backends.local_engine.loading.chat_template import ChatTemplate, text_messages
from backends.local_engine.server.served import LoadedEngine
from backends.local_engine.server.server import create_app

server, client = fake_engine_server.server, fake_engine_server.client  # the fixtures


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
