"""One request must never take the engine down: nullable fields sent as null are defaults, values out of vLLM's
ranges are 400s naming the field, and a request that raises inside the engine loop fails alone while the loop
serves on. Fake model over real HTTP (the real sampler where the crash was the sampler's)."""

import asyncio
from functools import partial

import fake_engine_server
import httpx
import orjson
import pytest
import torch
from test_engine_serving_fakes import VOCAB, FakeDetokenizer, FakeRunner, fake_probs

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.async_engine import AsyncEngine, RequestFailed
from backends.local_engine.engine.llm_engine import LLMEngine
from backends.local_engine.engine.request_checks import InvalidParam, check_params, without_nulls
from backends.local_engine.engine.sampler import probabilities
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.server.served import LoadedEngine
from backends.local_engine.server.server import create_app
from tests.fakes import ServerThread

server = fake_engine_server.server  # the fixture

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMPLETION = {"model": "fake", "prompt": "hi", "max_tokens": 3}
NULLABLE = ("temperature", "top_p", "min_p", "top_k", "repetition_penalty", "presence_penalty",
            "frequency_penalty", "seed", "stop", "max_tokens", "n", "logprobs", "logit_bias", "stop_token_ids",
            "min_tokens", "stream", "stream_options", "user", "response_format", "ignore_eos")  # fmt: skip


# --- (a) null is "absent, use the default" -------------------------------------------------------------


@pytest.mark.parametrize("name", NULLABLE)
@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_a_null_field_is_its_default(server, endpoint, name):
    body = {**(CHAT if endpoint == "chat/completions" else COMPLETION), name: None}
    response = httpx.post(f"{server[0]}/v1/{endpoint}", json=body)
    assert response.status_code == 200, response.text
    assert httpx.get(f"{server[0]}/health").status_code == 200


def test_every_field_null_at_once_gives_the_defaults(server):
    body = {**CHAT, **dict.fromkeys(NULLABLE)}
    response = httpx.post(f"{server[0]}/v1/chat/completions", json=body)
    assert response.status_code == 200 and len(response.json()["choices"]) == 1  # n: 1


def test_without_nulls_keeps_required_fields_for_validation_to_name():
    assert without_nulls({"model": "m", "messages": None, "top_p": None, "n": 2}) == {
        "model": "m",
        "messages": None,
        "n": 2,
    }


# --- (b) out of range: a 400 naming the field ------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"top_p": 0, "temperature": 0.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_tokens": 5}, "min_tokens"),  # more than max_tokens (3)
        ({"stop_token_ids": [VOCAB]}, "stop_token_ids"),
        ({"stop_token_ids": ["a"]}, "stop_token_ids"),
        ({"stop_token_ids": 7}, "stop_token_ids"),
        ({"logit_bias": {str(VOCAB): 1}}, "logit_bias"),
        ({"seed": 2**63}, "seed"),
    ],
)
def test_values_out_of_range_are_openai_shaped_400s(server, extra, param):
    response = httpx.post(f"{server[0]}/v1/chat/completions", json={**CHAT, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("prompt", [[VOCAB], [5, 100000000], [[5, 6], [VOCAB + 1]]])
def test_prompt_token_ids_outside_the_vocabulary_are_a_400(server, prompt):
    response = httpx.post(f"{server[0]}/v1/completions", json={**COMPLETION, "prompt": prompt})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    assert "[0, 64)" in response.json()["error"]["message"]


@pytest.mark.parametrize("top_k", [-1, 0, 1, VOCAB, 1_000_000])
def test_top_k_off_or_past_the_vocabulary_is_served(server, top_k):
    response = httpx.post(f"{server[0]}/v1/chat/completions", json={**CHAT, "top_k": top_k})
    assert response.status_code == 200, response.text


def test_min_tokens_past_the_max_tokens_when_unset_raises_it():
    body = {"model": "fake", "prompt": "x", "min_tokens": 300}
    from backends.local_engine.server.protocol import sampling_params

    params = sampling_params("completions", body, 256)
    assert params.max_tokens == 300 and params.min_tokens == 300
    check_params(params)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"temperature": None}, "temperature"),
        ({"top_p": None}, "top_p"),
        ({"min_p": float("nan")}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"top_k": "5"}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_the_engine_refuses_such_params_when_a_request_is_added(change, param):
    params = SamplingParams(**change)
    with pytest.raises(InvalidParam) as info:
        check_params(params)
    assert info.value.param == param
    engine = LLMEngine(
        EngineSettings(max_model_len=64), FakeRunner(), fake_probs, FakeDetokenizer, vocab_size=VOCAB
    )
    with pytest.raises(InvalidParam):
        engine.add_request([1, 2], params)
    with pytest.raises(InvalidParam, match="prompt"):
        engine.add_request([1, VOCAB], SamplingParams())
    assert engine.num_requests == 0


def test_the_real_sampler_takes_a_top_k_past_the_vocabulary():
    logits = torch.randn(2, VOCAB)
    params = [SamplingParams(top_k=1_000_000, temperature=0.5), SamplingParams(top_k=VOCAB, top_p=1.0)]
    probs = probabilities(logits, params, [[1], [2]], [[], []])
    assert torch.allclose(probs[0], torch.softmax(logits[0] / 0.5, dim=-1))
    assert torch.allclose(probs[1], torch.softmax(logits[1], dim=-1))


# --- (c) a request that raises inside the loop fails alone ------------------------------------------------

POISON = 424242  # the seed that makes the fake sampler raise, as a bug would
LATE_POISON = 434343  # ... from the request's third token on


def _poisoned_probs(logits, params, prompts, outputs):
    late = any(p.seed == LATE_POISON and len(out) >= 2 for p, out in zip(params, outputs, strict=True))
    if late or any(p.seed == POISON for p in params):
        raise TypeError("'<=' not supported between instances of 'NoneType' and 'float'")
    return fake_probs(logits, params, prompts, outputs)


def _poisoned_load() -> LoadedEngine:
    return fake_engine_server.fake_load(_poisoned_probs, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def poisoned():
    with ServerThread(create_app(_poisoned_load)) as running:
        while httpx.get(f"{running.url}/health").status_code != 200:
            pass
        yield running.url, running.server.config.app.state.engine_state.loaded.engine.engine


def test_a_request_that_raises_in_the_loop_is_a_500_and_the_engine_serves_on(poisoned):
    url, engine = poisoned
    for endpoint, body in (("chat/completions", CHAT), ("completions", COMPLETION)):
        failed = httpx.post(f"{url}/v1/{endpoint}", json={**body, "seed": POISON})
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error["code"] == "engine_request_failed" and "TypeError" in error["message"]
    assert httpx.get(f"{url}/health").status_code == 200
    ok = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
    assert engine.num_requests == 0 and engine.block_manager.num_free_blocks == 64


def test_a_stream_the_loop_fails_ends_with_an_error_event(poisoned):
    url, _ = poisoned
    body = {**COMPLETION, "seed": POISON, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 500  # the first step failed: before the stream started
    body = {**CHAT, "seed": LATE_POISON, "stream": True, "max_tokens": 10}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    chunks = [orjson.loads(e) for e in events if e != "[DONE]"]
    assert "[DONE]" not in events and chunks[-1]["error"]["code"] == "engine_request_failed"
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[:-1]]
    assert contents[0] == "" and len(contents) == 3  # the opening chunk and the first two tokens
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT).status_code == 200


def test_requests_waiting_beside_a_failed_step_are_served(poisoned):
    url, _ = poisoned

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            bodies = [{**COMPLETION, "prompt": "x" * 30, "max_tokens": 20} for _ in range(6)]
            bodies[2]["seed"] = POISON
            return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))

    statuses = [r.status_code for r in asyncio.run(burst())]
    assert (
        statuses.count(500) >= 1 and 200 in statuses
    )  # the poison's step fails; requests queued after it run
    assert httpx.post(f"{url}/v1/completions", json=COMPLETION).status_code == 200


def test_an_unexpected_error_while_adding_a_request_fails_that_request_alone():
    class Exploding(LLMEngine):
        def add_request(self, prompt_ids, params):
            if params.seed == POISON:
                raise KeyError("boom")
            return super().add_request(prompt_ids, params)

    engine = Exploding(EngineSettings(max_model_len=64), FakeRunner(), fake_probs, FakeDetokenizer)
    async_engine = AsyncEngine(engine)
    async_engine.start()

    async def run(seed: int | None) -> list:
        return [o async for o in async_engine.generate([1, 2, 3], SamplingParams(max_tokens=2, seed=seed))]

    try:
        with pytest.raises(RequestFailed, match="KeyError"):
            asyncio.run(run(POISON))
        assert async_engine.alive and len(asyncio.run(run(None))) == 2
    finally:
        async_engine.stop()


@pytest.mark.parametrize(("default", "expected"), [(5, 5), (None, 64 - 2)])
def test_a_request_without_max_tokens_gets_the_settings_default_or_the_context_left(default, expected):
    """max_tokens_when_unset 5: five tokens; None: until the 64-token context is full (vLLM's chat default)."""
    settings = {"max_model_len": 64, "max_tokens_when_unset": default}
    with ServerThread(
        create_app(partial(fake_engine_server.fake_load, vocab_size=VOCAB, **settings))
    ) as running:
        while httpx.get(f"{running.url}/health").status_code != 200:
            pass
        body = {"model": "fake", "prompt": "hi", "temperature": 0, "ignore_eos": True}
        answer = httpx.post(f"{running.url}/v1/completions", json=body).json()
        assert answer["usage"]["prompt_tokens"] == 2
        assert answer["usage"]["completion_tokens"] == expected
        assert answer["choices"][0]["finish_reason"] == "length"
