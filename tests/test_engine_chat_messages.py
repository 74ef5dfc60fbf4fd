"""The OpenAI tool-calling loop renders: an assistant message with `content: null` (or none) and `tool_calls`,
then `tool` results, through SmolLM2's own chat template; template failures caused by the request are 400s.
The packaged GGUF's tokenizer renders; the fake model generates."""

import os

import fake_engine_server
import httpx
import pytest

from backends.local_engine.loading.chat_template import ChatTemplate, text_messages
from backends.local_engine.loading.loader import load_gguf, packaged_model_path
from backends.local_engine.loading.tokenizer import Tokenizer, load_tokenizer
from backends.local_engine.server.served import LoadedEngine
from backends.local_engine.server.server import create_app
from backends.local_engine.server.tools import engine_chat
from tests.fakes import ServerThread

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
LOOP = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},  # the SDK's message.model_dump()
    {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
]


@pytest.fixture(scope="module")
def smollm2() -> Tokenizer:
    return load_tokenizer(load_gguf(packaged_model_path()).tokenizer)


@pytest.fixture(scope="module")
def url(smollm2):
    """The fake engine whose chats are rendered by SmolLM2's template (then mapped onto the fake's ids)."""

    def load() -> LoadedEngine:
        loaded = fake_engine_server.fake_load()
        encode_text = loaded.model.encode_text

        def encode_chat(messages, **options):  # the fake's context is 128 tokens: the prompt's end only
            return encode_text(smollm2.apply_chat_template(messages, **options)[-60:])

        loaded.model.encode_chat = encode_chat
        return loaded

    with ServerThread(create_app(load)) as running:
        while httpx.get(f"{running.url}/health").status_code != 200:
            pass
        yield running.url


def _chat(url: str, messages: list, **extra) -> httpx.Response:
    body = {"model": "fake", "messages": messages, "max_tokens": 2, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body)


def test_the_tool_calling_loop_renders_with_smollm2s_template(smollm2):
    body, _ = engine_chat({"messages": LOOP})
    text = smollm2.apply_chat_template(body["messages"])
    assert (
        '<|im_start|>assistant\n<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}<|im_end|>'
        in text
    )
    assert "<|im_start|>tool\n22C<|im_end|>\n<|im_start|>assistant\n" in text


@pytest.mark.parametrize(
    "assistant",
    [
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "assistant", "tool_calls": [CALL]},
        {"role": "assistant", "content": None},
        {"role": "assistant"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
    ],
)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_assistant_messages_without_content_are_answered(url, assistant, tools):
    messages = [LOOP[0], assistant, {"role": "tool", "tool_call_id": "call_1", "content": "22C"}]
    response = _chat(url, messages, **({"tools": tools, "tool_choice": "none"} if tools else {}))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


def test_tokenize_counts_the_tool_loop(url):
    response = httpx.post(f"{url}/tokenize", json={"model": "fake", "messages": LOOP})
    assert response.status_code == 200 and response.json()["count"] > 0


def test_null_content_becomes_empty_text():
    assert text_messages([{"role": "assistant", "content": None}, {"role": "assistant"}]) == [
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": ""},
    ]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"messages": "x"}, "chat_template_kwargs"), ({"add_generation_prompt": 1}, "chat_template_kwargs")],
)
def test_template_kwargs_that_would_replace_the_request_are_a_400(url, kwargs, param):
    response = _chat(url, [LOOP[0]], chat_template_kwargs=kwargs)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_any_error_inside_the_template_is_a_400_not_a_500():
    template = ChatTemplate("{{ messages[0]['content'] + 1 }}", "", "")
    with pytest.raises(ValueError, match="chat template"):
        template.render([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="chat template"):
        template.render([{"role": "user", "content": "x"}], template_kwargs={"eos_token": None})


def test_a_template_error_from_the_request_reaches_the_client_as_a_400():
    """A template that concatenates a message's `name`: a number there is the request's fault, a 400."""
    template = ChatTemplate(
        "{% for m in messages %}{{ m['role'] + (m['name'] or '') + m['content'] }}{% endfor %}", "", ""
    )

    def load() -> LoadedEngine:
        loaded = fake_engine_server.fake_load()
        encode_text = loaded.model.encode_text
        loaded.model.encode_chat = lambda messages, **options: encode_text(
            template.render(messages, **options)
        )
        return loaded

    with ServerThread(create_app(load)) as running:
        while httpx.get(f"{running.url}/health").status_code != 200:
            pass
        assert _chat(running.url, [{"role": "user", "name": "ann", "content": "x"}]).status_code == 200
        response = _chat(running.url, [{"role": "user", "name": 5, "content": "x"}])
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages" and error["type"] == "invalid_request_error"
    assert error["message"].startswith("chat template:")
