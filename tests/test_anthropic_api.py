"""/v1/messages through the official anthropic SDK, in front of the fake upstream: the chat pipeline underneath."""

from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import MASTER_KEY
from tests.fakes import FakeUpstream, ServerThread

WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip


@pytest.fixture
def client(gateway: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=MASTER_KEY, max_retries=0)


def sent(upstream: tuple[FakeUpstream, ServerThread]) -> dict[str, Any]:
    return upstream[0].requests[-1]["body"]


def test_plain_message_with_system(client: anthropic.Anthropic, upstream: tuple) -> None:
    raw = client.messages.with_raw_response.create(
        model="fake-model",
        max_tokens=50,
        system="Be brief.",
        messages=[{"role": "user", "content": "hello there"}],
    )
    message = raw.parse()
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == "echo: hello there"
    assert (message.role, message.stop_reason, message.model) == ("assistant", "end_turn", "fake-model")
    assert (message.usage.input_tokens, message.usage.output_tokens) == (7, 3)
    assert raw.headers["x-served-by"] == "fake-1" and raw.headers["request-id"]
    body = sent(upstream)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
    ]
    assert body["max_tokens"] == 50
    assert MASTER_KEY.encode() not in b"".join(
        upstream[0].requests[-1]["headers"].values()
    )  # our key stays here


def test_multi_turn_and_image(client: anthropic.Anthropic, upstream: tuple) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    client.messages.create(model="fake-model", max_tokens=20, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
        {"role": "user", "content": [image, {"type": "text", "text": "what is this"}]},
    ])  # fmt: skip
    messages = sent(upstream)["messages"]
    assert messages[:2] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert messages[2]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "text", "text": "what is this"},
    ]


def test_streamed_text(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="fake-model", max_tokens=20, messages=[{"role": "user", "content": "one two"}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert final.content[0].text == "echo: one two"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 3


def test_tool_use_and_tool_result(client: anthropic.Anthropic, upstream: tuple) -> None:
    first = client.messages.create(model="fake-model", max_tokens=50, tools=[WEATHER],
                                   tool_choice={"type": "auto"}, messages=[{"role": "user", "content": "use-tool"}])  # fmt: skip
    [block] = first.content
    assert first.stop_reason == "tool_use"
    assert (block.type, block.id, block.name, block.input) == (
        "tool_use",
        "toolu_fake_1",  # the upstream's call_fake_1 in Anthropic's form
        "get_weather",
        {"city": "Paris"},
    )
    assert sent(upstream)["tools"][0]["function"]["parameters"] == WEATHER["input_schema"]
    second = client.messages.create(model="fake-model", max_tokens=50, tools=[WEATHER], messages=[
        {"role": "user", "content": "use-tool"},
        {"role": "assistant", "content": [block.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "sunny"}]},
    ])  # fmt: skip
    assert second.content[0].text == "echo: sunny" and second.stop_reason == "end_turn"
    messages = sent(upstream)["messages"]
    assert messages[1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
    }
    assert messages[1]["tool_calls"][0]["id"] == messages[2]["tool_call_id"] == "toolu_fake_1"
    assert messages[2] == {"role": "tool", "tool_call_id": "toolu_fake_1", "content": "sunny"}


def test_named_tool_choice_and_streamed_tool_use(client: anthropic.Anthropic, upstream: tuple) -> None:
    with client.messages.stream(model="fake-model", max_tokens=50, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=[{"role": "user", "content": "use-tool"}]) as stream:  # fmt: skip
        final = stream.get_final_message()
    assert sent(upstream)["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert final.stop_reason == "tool_use" and final.content[0].input == {"city": "Paris"}
    assert final.content[0].id.startswith("toolu_")


def test_output_config_format_becomes_a_json_schema(client: anthropic.Anthropic, upstream: tuple) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    client.messages.create(model="fake-model", max_tokens=5, messages=[{"role": "user", "content": "x"}],
                           output_config={"format": {"type": "json_schema", "schema": schema}},
                           cache_control={"type": "ephemeral"})  # fmt: skip
    assert sent(upstream)["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }


def test_errors_are_anthropic_shaped(client: anthropic.Anthropic, gateway: ServerThread) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model="fake-model", max_tokens=5, messages=[{"role": "system", "content": "x"}]
        )
    assert bad.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                         "message": bad.value.body["error"]["message"]}}  # fmt: skip
    wrong = anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="fake-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    raw = httpx.post(
        gateway.url + "/v1/messages", content=b"{oops", headers={"x-api-key": MASTER_KEY}, timeout=10
    )
    assert raw.status_code == 400 and raw.json()["type"] == "error"
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(
            model="fake-model", max_tokens=5, messages=[{"role": "user", "content": "fail:429"}]
        )


def test_mid_stream_failure_raises_in_sdk(client: anthropic.Anthropic) -> None:
    with (
        pytest.raises(anthropic.APIError),
        client.messages.stream(
            model="fake-model", max_tokens=5, messages=[{"role": "user", "content": "die-mid-stream"}]
        ) as stream,
    ):
        stream.get_final_message()


def test_bearer_key_works_too(gateway: ServerThread) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, auth_token=MASTER_KEY, max_retries=0)
    message = client.messages.create(
        model="fake-model", max_tokens=5, messages=[{"role": "user", "content": "b"}]
    )
    assert message.content[0].text == "echo: b"


def test_count_tokens_where_no_deployment_can_count(client: anthropic.Anthropic, upstream: tuple) -> None:
    """An OpenAI-style upstream serves no /tokenize: a 400 that says so, not a count made up here."""
    with pytest.raises(anthropic.BadRequestError) as error:
        client.messages.count_tokens(model="fake-model", messages=[{"role": "user", "content": "hi"}])
    assert (
        "count tokens" in error.value.message and error.value.body["error"]["type"] == "invalid_request_error"
    )


def test_an_assistant_prefill_is_continued(client: anthropic.Anthropic, upstream: tuple) -> None:
    """A final assistant turn asks the model to continue it (continue_final_message), as Anthropic does."""
    client.messages.create(model="fake-model", max_tokens=5, messages=[
        {"role": "user", "content": "Give me JSON"}, {"role": "assistant", "content": '{"a":'}])  # fmt: skip
    body = sent(upstream)
    assert body["messages"][-1] == {"role": "assistant", "content": '{"a":'}
    assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
    client.messages.create(model="fake-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert "continue_final_message" not in sent(upstream)
    with pytest.raises(anthropic.BadRequestError) as error:
        client.messages.create(model="fake-model", max_tokens=5, messages=[
            {"role": "user", "content": "x"}, {"role": "assistant", "content": "trailing "}])  # fmt: skip
    assert "trailing whitespace" in error.value.message


@pytest.mark.parametrize(
    ("change", "words"),
    [({"max_tokens": "4"}, "valid integer"), ({"max_tokens": 4.5}, "valid integer"), ({}, "Field required"),
     ({"temperature": 1.5}, "between 0 and 1")],
)  # fmt: skip
def test_messages_field_errors_say_what_is_wrong(gateway: ServerThread, change: dict, words: str) -> None:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], **change}
    if not change:
        body.pop("max_tokens", None)
    else:
        body.setdefault("max_tokens", 5)
    answer = httpx.post(
        gateway.url + "/v1/messages", json=body, headers={"x-api-key": MASTER_KEY}, timeout=30
    )
    assert answer.status_code == 400 and words in answer.json()["error"]["message"], answer.text


def test_messages_paths_answer_in_anthropics_shape(gateway: ServerThread) -> None:
    wrong_method = httpx.get(gateway.url + "/v1/messages", headers={"x-api-key": MASTER_KEY}, timeout=10)
    unknown = httpx.post(
        gateway.url + "/v1/messages/nope", headers={"x-api-key": MASTER_KEY}, json={}, timeout=10
    )
    no_key = httpx.post(gateway.url + "/v1/messages", json={"model": "fake-model"}, timeout=10)
    for answer, status, kind in ((wrong_method, 405, "invalid_request_error"), (unknown, 404, "not_found_error"),
                                 (no_key, 401, "authentication_error")):  # fmt: skip
        assert answer.status_code == status and answer.json()["type"] == "error", answer.text
        assert answer.json()["error"]["type"] == kind
    assert "x-api-key" in no_key.json()["error"]["message"]
    models = httpx.get(gateway.url + "/v1/models", headers={"authorization": f"Bearer {MASTER_KEY}"}).json()
    assert all(card["created"] > 1_700_000_000 for card in models["data"])
