"""The gateway through the official openai SDK: sync, async, streaming, errors."""

import asyncio

import openai
import pytest

from tests.conftest import MASTER_KEY
from tests.fakes import FakeUpstream, ServerThread


@pytest.fixture
def client(gateway: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER_KEY, max_retries=0)


def test_chat_completion_sync(client: openai.OpenAI, upstream: tuple[FakeUpstream, ServerThread]) -> None:
    response = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "hello there"}]
    )
    completion = response.parse()
    assert completion.choices[0].message.content == "echo: hello there"
    assert completion.usage.prompt_tokens == 7
    assert len(response.headers["x-request-id"]) == 32
    assert response.headers["x-served-by"] == "fake-1"
    assert upstream[0].requests[-1]["body"]["model"] == "upstream-model"


def test_completions_endpoint(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="fake-model", prompt="one two")
    assert completion.choices[0].text == "echo: one two"


def test_embeddings_endpoint(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model="fake-model", input=["a", "b"])
    assert [d.index for d in result.data] == [0, 1]


def test_models_list(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["fake-model"]


def test_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "a b c"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: a b c"
    assert chunks[-1].usage.completion_tokens == 4 and not chunks[-1].choices


def test_streaming_without_usage_hides_usage_chunk(client: openai.OpenAI, upstream: tuple) -> None:
    chunks = list(
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    assert all(c.choices and c.usage is None for c in chunks)
    assert upstream[0].requests[-1]["body"]["stream_options"] == {"include_usage": True}


def test_async_client(gateway: ServerThread) -> None:
    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=MASTER_KEY, max_retries=0)
        calls = [
            client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": f"q{i}"}]
            )
            for i in range(5)
        ]
        results = await asyncio.gather(*calls)
        await client.close()
        return [r.choices[0].message.content for r in results]

    assert asyncio.run(run()) == [f"echo: q{i}" for i in range(5)]


def test_wrong_key_is_401(gateway: ServerThread) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as error:
        client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])
    assert error.value.body["code"] == "invalid_api_key"
    assert "sk-wrong" not in str(error.value)


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert error.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(("status", "exception"), [(400, openai.BadRequestError), (429, openai.RateLimitError),
                                                  (422, openai.UnprocessableEntityError), (500, openai.InternalServerError)])  # fmt: skip
def test_upstream_errors_map_to_sdk_exceptions(client: openai.OpenAI, status: int, exception: type) -> None:
    with pytest.raises(exception) as error:
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": f"fail:{status}"}]
        )
    expected = 502 if status == 500 else status
    assert error.value.status_code == expected


def test_mid_stream_failure_raises_in_sdk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "die-mid-stream"}], stream=True
    )
    with pytest.raises(openai.APIError):
        list(stream)
