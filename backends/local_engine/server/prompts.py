"""The token ids a request asks about: a chat rendered by the model's chat template, or completions' prompts
(one string, one array of token ids, or a batch of either, as OpenAI's and vLLM's completions take them)."""

from dataclasses import dataclass
from typing import Any, Protocol

from core.errors import bad_request

MAX_PROMPTS = 128  # prompts in one completions batch


class Encoders(Protocol):
    """What the server's model offers for turning requests into ids (server.ServedModel)."""

    def encode_text(self, text: str) -> list[int]: ...
    def encode_chat(self, messages: list[dict[str, Any]], **options: Any) -> list[int]: ...
    def token_text(self, token_id: int) -> str: ...


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    echo: str = ""  # completions' `echo`: the prompt's text, put before each of its answers


def prompts(model: Encoders, endpoint: str, body: dict[str, Any]) -> list[Prompt]:
    if endpoint == "chat":
        return [Prompt(chat_ids(model, body))]
    batch = []
    for item in _items(body["prompt"]):
        ids = model.encode_text(item) if isinstance(item, str) else item
        echo = (
            (item if isinstance(item, str) else "".join(map(model.token_text, ids)))
            if body.get("echo")
            else ""
        )
        batch.append(Prompt(ids, echo))
    return batch


def chat_ids(model: Encoders, body: dict[str, Any]) -> list[int]:
    """The conversation through the template, with vLLM's template options."""
    options: dict[str, Any] = {
        key: body[key] for key in ("add_generation_prompt", "continue_final_message") if key in body
    }
    if body.get("chat_template_kwargs"):
        options["template_kwargs"] = body["chat_template_kwargs"]
    if options.get("continue_final_message"):
        options.setdefault("add_generation_prompt", False)
        if body["messages"][-1].get("role") != "assistant":
            raise bad_request("continue_final_message needs an assistant message last.", param="messages")
    try:
        return model.encode_chat(body["messages"], **options)
    except ValueError as error:  # the chat template refused the conversation (e.g. its role order)
        raise bad_request(str(error), param=getattr(error, "param", "messages")) from error


def _items(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str) or _token_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _token_ids(p) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise bad_request(
                f"At most {MAX_PROMPTS} prompts in one request, got {len(prompt)}.", param="prompt"
            )
        return list(prompt)
    raise bad_request(
        "'prompt' must be a string, an array of token ids, or an array of either.", param="prompt"
    )


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )
