"""Render a checkpoint's Jinja chat template (`tokenizer.chat_template`) the way transformers does."""

from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from backends.local_engine.errors import InvalidParam
from core.errors import bad_request

# ChatML, used when a checkpoint carries no template of its own.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str, eos_token: str) -> None:
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        self.template = environment.from_string(source or DEFAULT_TEMPLATE)
        self.special = {"bos_token": bos_token, "eos_token": eos_token}

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Prompt text; ValueError when the template rejects the conversation (e.g. bad role order).

        vLLM's options: `continue_final_message` ends the prompt inside the last (assistant) message, so the
        model continues its text; `template_kwargs` are extra variables for the template (e.g. enable_thinking).
        """
        reserved = sorted({"messages", "add_generation_prompt"} & set(template_kwargs or {}))
        if reserved:
            message = f"chat_template_kwargs cannot set {reserved[0]!r}: it is the request's own field."
            raise InvalidParam(message, "chat_template_kwargs")
        variables = {**(template_kwargs or {}), **self.special}
        try:
            text = self.template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **variables
            )
        except Exception as error:  # TemplateError, or a TypeError the request's values caused inside it
            raise ValueError(f"chat template: {error}") from error
        if not continue_final_message:
            return text
        final = messages[-1].get("content") or ""
        end = text.rfind(final.strip()) if final.strip() else -1
        if end < 0:
            raise ValueError("chat template: the final message's text is not in the rendered prompt")
        return text[: end + len(final.strip())]


def text_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose `content` is a string: the text parts of an array of OpenAI content parts joined into
    one, a null or missing content (an assistant's with `tool_calls`) as "" (as vLLM renders it), since
    templates concatenate it.

    The engine's models read text only: any other part (image_url, input_audio, file, ...) is a 400 naming it.
    """
    return [_text_message(i, m) for i, m in enumerate(messages)]


def _text_message(i: int, message: dict[str, Any]) -> dict[str, Any]:
    if message.get("content") is None:
        return {**message, "content": ""}
    if not isinstance(message["content"], list):
        return message
    texts = []
    for j, part in enumerate(message["content"]):
        param = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        readable = kind == "text" or (kind == "refusal" and message.get("role") == "assistant")
        if not readable:
            raise bad_request(
                f"Invalid content part type {kind!r} in '{param}': this model reads text only "
                "(parts of type 'text').",
                param=f"messages[{i}].content",
                code="unsupported_content_type",
            )
        if not isinstance(part.get(kind), str):
            raise bad_request(f"Missing or non-string '{param}.{kind}'.", param=f"{param}.{kind}")
        texts.append(part[kind])
    return {**message, "content": "".join(texts)}
