"""The gateway driven by LangChain's ChatOpenAI, as a user would, over chat completions and over /v1/responses.

Nothing here counts tokens: that path makes tiktoken download its encodings, and tests run offline.
"""

from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ValidationError

from tests.conftest import MASTER_KEY
from tests.fakes import FakeUpstream, ServerThread

MODES = [pytest.param(False, id="chat-completions"), pytest.param(True, id="responses")]


@tool
def get_weather(city: str) -> str:
    """Weather in a city."""
    return f"sunny in {city}"


class Weather(BaseModel):
    """Where to look the weather up."""

    city: str


def chat(gateway: ServerThread, use_responses_api: bool, **extra: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=gateway.url + "/v1",
        api_key=MASTER_KEY,
        model="fake-model",
        max_retries=0,
        timeout=30,
        use_responses_api=use_responses_api,
        **extra,
    )


def last_path(upstream: tuple[FakeUpstream, ServerThread]) -> str:
    return upstream[0].requests[-1]["path"]


def text_of(message: AIMessage) -> str:
    return message.text if isinstance(message.text, str) else message.text()


@pytest.mark.parametrize("responses", MODES)
def test_invoke(gateway: ServerThread, upstream: tuple, responses: bool) -> None:
    answer = chat(gateway, responses).invoke([HumanMessage("hello there")])
    assert isinstance(answer, AIMessage)
    assert text_of(answer) == "echo: hello there"
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == 3 and answer.usage_metadata["total_tokens"] == 10
    assert last_path(upstream) == "/v1/chat/completions"  # the Responses mode runs on the chat pipeline
    assert answer.response_metadata["id"].startswith("resp_" if responses else "chatcmpl")


@pytest.mark.parametrize("responses", MODES)
def test_stream(gateway: ServerThread, responses: bool) -> None:
    chunks = list(chat(gateway, responses, stream_usage=True).stream("one two three"))
    assert len(chunks) > 2 and all(isinstance(c, AIMessageChunk) for c in chunks)
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert text_of(whole) == "echo: one two three"
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] > 0


@pytest.mark.parametrize("responses", MODES)
def test_bind_tools_round_trip(gateway: ServerThread, upstream: tuple, responses: bool) -> None:
    model = chat(gateway, responses).bind_tools([get_weather])
    question = HumanMessage("use-tool please")
    first = model.invoke([question])
    [call] = first.tool_calls
    assert (call["name"], call["args"], call["id"]) == ("get_weather", {"city": "Paris"}, "call_fake_1")
    sent_tool = upstream[0].requests[-1]["body"]["tools"][0]["function"]
    assert sent_tool["name"] == "get_weather" and sent_tool["parameters"]["required"] == ["city"]
    result = get_weather.invoke(call)
    assert isinstance(result, ToolMessage) and result.tool_call_id == "call_fake_1"
    second = model.invoke([question, first, result])
    assert text_of(second) == "echo: sunny in Paris"
    messages = upstream[0].requests[-1]["body"]["messages"]
    assert messages[-2]["tool_calls"][0]["id"] == "call_fake_1"
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_fake_1", "content": "sunny in Paris"}


@pytest.mark.parametrize("responses", MODES)
def test_streamed_tool_call(gateway: ServerThread, responses: bool) -> None:
    chunks = list(chat(gateway, responses).bind_tools([get_weather]).stream("use-tool"))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    [call] = whole.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})


@pytest.mark.parametrize("responses", MODES)
def test_structured_output_by_function_calling(gateway: ServerThread, responses: bool) -> None:
    """The fake answers JSON only as tool arguments, so the function-calling method is the one it can satisfy."""
    model = chat(gateway, responses).with_structured_output(Weather, method="function_calling")
    assert model.invoke("use-tool: where?") == Weather(city="Paris")


@pytest.mark.parametrize("responses", MODES)
def test_structured_output_by_json_schema_reaches_the_upstream(
    gateway: ServerThread, upstream: tuple, responses: bool
) -> None:
    """LangChain's default method: the schema travels as response_format (from `text.format` in the Responses mode).

    The fake only echoes, so the reply does not parse; the forwarded schema is what is checked.
    """
    model = chat(gateway, responses).with_structured_output(Weather)
    with pytest.raises(ValidationError, match="echo: where"):
        model.invoke("where")
    response_format = upstream[0].requests[-1]["body"]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "Weather"
    assert response_format["json_schema"]["schema"]["required"] == ["city"]
