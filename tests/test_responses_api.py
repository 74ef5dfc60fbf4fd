"""/v1/responses through the official openai SDK, in front of the fake upstream: the chat pipeline underneath."""

import uuid
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis

from gateway.responses_api.store import MemoryResponseStore, RedisResponseStore, StoredResponse
from tests.conftest import MASTER_KEY
from tests.fakes import FakeUpstream, ServerThread

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip


@pytest.fixture
def client(gateway: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER_KEY, max_retries=0)


def sent(upstream: tuple[FakeUpstream, ServerThread]) -> dict[str, Any]:
    return upstream[0].requests[-1]["body"]


def test_create_with_instructions(client: openai.OpenAI, upstream: tuple[FakeUpstream, ServerThread]) -> None:
    raw = client.responses.with_raw_response.create(
        model="fake-model", input="hello there", instructions="Be brief.", max_output_tokens=20
    )
    response = raw.parse()
    assert response.output_text == "echo: hello there"
    assert (response.object, response.status, response.model) == ("response", "completed", "fake-model")
    assert response.id.startswith("resp_") and raw.headers["x-served-by"] == "fake-1"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (7, 3)
    assert response.usage.total_tokens == 10
    assert response.completed_at >= response.created_at and response.output[0].status == "completed"
    body = sent(upstream)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
    ]
    assert body["max_tokens"] == 20 and body["model"] == "upstream-model"


def test_stream_emits_the_documented_event_sequence(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="fake-model", input="one two", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "echo: one two"
    final = events[-1].response
    assert final.output_text == "echo: one two" and final.usage.output_tokens == 3


def test_stream_helper_accumulates(client: openai.OpenAI) -> None:
    with client.responses.stream(model="fake-model", input="helper text") as stream:
        final = stream.get_final_response()
    assert final.output_text == "echo: helper text"


def test_items_with_an_image_pass_the_image_through(client: openai.OpenAI, upstream: tuple) -> None:
    image = "data:image/png;base64,iVBORw0KGgo="
    content = [{"type": "input_text", "text": "what is this"}, {"type": "input_image", "image_url": image}]
    response = client.responses.create(model="fake-model", input=[{"role": "user", "content": content}])
    assert response.output_text.startswith("echo: what is this")
    parts = sent(upstream)["messages"][-1]["content"]
    assert parts == [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": image}},
    ]


def test_function_tools_and_their_results(client: openai.OpenAI, upstream: tuple) -> None:
    first = client.responses.create(
        model="fake-model", input="use-tool now", tools=[WEATHER], tool_choice="auto"
    )
    [call] = first.output
    assert (call.type, call.name, call.arguments, call.call_id) == (
        "function_call",
        "get_weather",
        '{"city": "Paris"}',
        "call_fake_1",
    )
    tool = sent(upstream)["tools"][0]
    assert tool == {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    second = client.responses.create(
        model="fake-model",
        previous_response_id=first.id,
        tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"}],
    )
    assert second.output_text == "echo: sunny, 21C" and second.previous_response_id == first.id
    messages = sent(upstream)["messages"]
    assert messages[1]["tool_calls"][0]["id"] == "call_fake_1"
    assert messages[2] == {"role": "tool", "tool_call_id": "call_fake_1", "content": "sunny, 21C"}
    with pytest.raises(
        openai.BadRequestError
    ) as unanswered:  # an output for a call never made: 400, as OpenAI
        client.responses.create(model="fake-model", previous_response_id=first.id, tools=[WEATHER],
                                input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}])  # fmt: skip
    assert "call_nope" in unanswered.value.message and unanswered.value.body["param"] == "input"


def test_tool_calls_stream_as_argument_deltas(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="fake-model", input="use-tool", tools=[WEATHER], stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == '{"city": "Paris"}'
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == '{"city": "Paris"}'
    assert events[-1].response.output[0].name == "get_weather"


def test_previous_response_id_carries_the_conversation(client: openai.OpenAI, upstream: tuple) -> None:
    first = client.responses.create(model="fake-model", input="my name is Ann", instructions="old")
    client.responses.create(model="fake-model", input="what is my name", previous_response_id=first.id)
    assert sent(upstream)["messages"] == [
        {"role": "user", "content": "my name is Ann"},
        {"role": "assistant", "content": "echo: my name is Ann"},
        {"role": "user", "content": "what is my name"},
    ]  # instructions are not carried over, as documented


def test_retrieve_and_delete(client: openai.OpenAI) -> None:
    created = client.responses.create(model="fake-model", input="keep me")
    assert client.responses.retrieve(created.id).output_text == "echo: keep me"
    items = client.responses.input_items.list(created.id)
    assert items.data[0].content[0].text == "keep me"
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="fake-model", input="x", previous_response_id=created.id)


def test_store_false_keeps_nothing(client: openai.OpenAI) -> None:
    created = client.responses.create(model="fake-model", input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def test_json_schema_format_becomes_response_format(client: openai.OpenAI, upstream: tuple) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    client.responses.create(model="fake-model", input="json please",
                            text={"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}})  # fmt: skip
    assert sent(upstream)["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}}  # fmt: skip


def test_the_exact_cache_applies(client: openai.OpenAI) -> None:
    statuses = [client.responses.with_raw_response.create(model="fake-model", input="cache me", temperature=0)
                .headers["x-cache-status"] for _ in range(2)]  # fmt: skip
    assert statuses == ["miss", "hit"]


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"model": "nope", "input": "x"}, openai.NotFoundError),
    ({"model": "fake-model", "input": [{"role": "wizard", "content": "x"}]}, openai.BadRequestError),
    ({"model": "fake-model", "input": "x", "tools": [{"type": "web_search"}]}, openai.BadRequestError),
    ({"model": "fake-model", "input": "x", "extra_body": {"frobnicate": 1}}, openai.BadRequestError),
    ({"model": "fake-model", "input": "x", "temperature": 9}, openai.BadRequestError),
])  # fmt: skip
def test_bad_requests_get_openai_errors(client: openai.OpenAI, kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        client.responses.create(**kwargs)


def test_wrong_key_is_401(gateway: ServerThread) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.responses.create(model="fake-model", input="x")
    with pytest.raises(openai.AuthenticationError):
        client.responses.retrieve("resp_x")


def test_mid_stream_failure_raises_in_sdk(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIError):
        list(client.responses.create(model="fake-model", input="die-mid-stream", stream=True))


def record(response_id: str, tenant: str = "t") -> StoredResponse:
    return StoredResponse(tenant, {"id": response_id, "output": []}, [{"role": "user", "content": "x"}], [])


async def test_memory_store_expires_and_evicts() -> None:
    store = MemoryResponseStore(ttl_s=0.0, max_entries=2)
    await store.put(record("a"))
    assert await store.get("a") is None  # ttl 0: already expired
    store = MemoryResponseStore(ttl_s=60, max_entries=2)
    for name in "abc":
        await store.put(record(name))
    assert await store.get("a") is None and (await store.get("c")).history[0]["content"] == "x"


async def test_redis_store_round_trip_with_ttl() -> None:
    client = aioredis.Redis.from_url("redis://127.0.0.1:6379")
    prefix = f"test:responses:{uuid.uuid4().hex}"
    store = RedisResponseStore(client, prefix, ttl_s=120)
    await store.put(record("resp_1", tenant="acme"))
    assert (await store.get("resp_1")).tenant == "acme"
    assert 0 < await client.ttl(f"{prefix}:resp_1") <= 120
    assert await store.delete("resp_1") and await store.get("resp_1") is None
    await store.aclose()


@pytest.mark.parametrize("given", [0, -3, "5", True])
def test_a_bad_max_output_tokens_is_named_as_sent(client: openai.OpenAI, given: object) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model="fake-model", input="x", max_output_tokens=given)
    assert error.value.body["param"] == "max_output_tokens"


def test_every_item_of_a_cut_response_is_incomplete() -> None:
    """A function call cut by max_output_tokens is `incomplete` too, not `completed` (outside audit)."""
    from gateway.responses_api import reply

    output = [reply.function_call_item("fc_1", "call_1", "f", '{"a": 1'), reply.message_item("msg_0", "hi")]
    finished = reply.finish(reply.skeleton("resp_x", "m", {}), output, "length", None)
    assert [item["status"] for item in finished["output"]] == ["incomplete", "incomplete"]
    finished = reply.finish(reply.skeleton("resp_y", "m", {}), output, "tool_calls", None)
    assert [item["status"] for item in finished["output"]] == ["completed", "completed"]
