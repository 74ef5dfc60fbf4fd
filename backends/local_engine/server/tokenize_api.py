"""vLLM's POST /tokenize on the engine's server: the token ids of a prompt or of a conversation, counted as a
request carrying it would count them (the same chat template, template options and tools prompt), with the
context limit. Clients use it to count tokens before they send (vLLM's body and answer:
`{"count", "max_model_len", "tokens", "token_strs"}`). And vLLM's POST /detokenize: `{"model", "tokens"}` to
`{"prompt": text}`, special tokens included (as vLLM decodes them)."""

from collections.abc import Callable
from typing import Any, Protocol

from backends.local_engine.engine.request_checks import InvalidParam, check_token_ids
from backends.local_engine.server.prompts import Encoders, chat_ids
from backends.local_engine.server.tools import engine_chat
from core.errors import bad_request, model_not_found
from core.validation import validate

_KEYS = {"model", "prompt", "messages", "tools", "tool_choice", "add_generation_prompt", "continue_final_message",
         "chat_template_kwargs", "add_special_tokens", "return_token_strs"}  # fmt: skip


def tokenize(model: Encoders, name: str, body: Any, max_model_len: int) -> dict[str, Any]:
    """The answer to one /tokenize body; a 400 (OpenAI's shape) for what it cannot count as asked."""
    if not isinstance(body, dict):
        raise bad_request("The body must be a JSON object.")
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise bad_request(f"Unrecognized request argument: {unknown[0]!r}.", param=unknown[0])
    if body.get("model") is not None and body["model"] != name:
        raise model_not_found(str(body["model"]))
    if ("prompt" in body) == ("messages" in body):
        raise bad_request("Send either 'prompt' (a string) or 'messages' (a conversation).", param="prompt")
    if "add_special_tokens" in body and body["add_special_tokens"] is not ("prompt" in body):
        raise bad_request("This engine adds special tokens to a prompt and leaves them to the chat template "
                          "for messages; 'add_special_tokens' cannot change that.", param="add_special_tokens",
                          code="unsupported_parameter")  # fmt: skip
    ids = _prompt_ids(model, body) if "prompt" in body else _chat_ids(model, name, body)
    strs = [model.token_text(t) for t in ids] if body.get("return_token_strs") else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}


def _prompt_ids(model: Encoders, body: dict[str, Any]) -> list[int]:
    if not isinstance(body["prompt"], str):
        raise bad_request("'prompt' must be a string.", param="prompt")
    return model.encode_text(body["prompt"])


def _chat_ids(model: Encoders, name: str, body: dict[str, Any]) -> list[int]:
    chat = {key: body[key] for key in ("messages", "tools", "tool_choice") if key in body}
    validate("chat", {"model": name, **chat})  # the shapes a chat completion checks
    return chat_ids(model, engine_chat(body)[0])


class Decoder(Protocol):
    """What /detokenize needs of the server's model (server.ServedModel)."""

    decode: Callable[[list[int]], str] | None
    vocab_size: int | None


def detokenize(model: Decoder, name: str, body: Any) -> dict[str, Any]:
    """The answer to one /detokenize body; a 400 for ids outside the vocabulary or a body of another shape."""
    if not isinstance(body, dict):
        raise bad_request("The body must be a JSON object.")
    unknown = sorted(set(body) - {"model", "tokens"})
    if unknown:
        raise bad_request(f"Unrecognized request argument: {unknown[0]!r}.", param=unknown[0])
    if body.get("model") is not None and body["model"] != name:
        raise model_not_found(str(body["model"]))
    if "tokens" not in body:
        raise bad_request("'tokens' is required: the token ids to turn into text.", param="tokens")
    try:
        check_token_ids(body["tokens"], model.vocab_size, "tokens")
    except InvalidParam as error:
        raise bad_request(str(error), param=error.param, code=error.code) from error
    if model.decode is None:
        raise bad_request("This model has no tokenizer to decode with.", code="unsupported_parameter")
    return {"prompt": model.decode(body["tokens"])}
