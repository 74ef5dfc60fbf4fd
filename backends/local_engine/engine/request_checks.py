"""What a request may ask of the engine, checked before it reaches the loop.

OpenAI's and vLLM's nullable fields sent as null mean "absent, use the default" (as both servers read them),
and sampling parameters and token ids out of vLLM's ranges are refused with an `InvalidParam` naming the
field (a 400 at the server). The engine runs the same checks when a request is added, so a value that slips
past the server fails that request alone instead of a step of the loop.
"""

import math
from typing import Any

from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.errors import InvalidParam
from core.completion import requested_completion_field

_REQUIRED = ("model", "messages", "prompt")  # null there is a mistake the validation names, not a default
_INT64 = 2**63
__all__ = ["InvalidParam", "check_params", "check_room", "check_token_ids", "without_nulls"]


def without_nulls(body: dict[str, Any]) -> dict[str, Any]:
    """The body with every optional field sent as null left out."""
    return {key: value for key, value in body.items() if value is not None or key in _REQUIRED}


def check_params(params: SamplingParams, vocab_size: int | None = None) -> None:
    """vLLM's rules for the sampling parameters; InvalidParam for the first one broken."""
    _number(params.temperature, "temperature", "a number >= 0", lambda v: v >= 0)
    _number(params.top_p, "top_p", "a number in (0, 1]", lambda v: 0 < v <= 1)
    _number(params.min_p, "min_p", "a number in [0, 1]", lambda v: 0 <= v <= 1)
    _number(params.repetition_penalty, "repetition_penalty", "a number > 0", lambda v: v > 0)
    for name in ("presence_penalty", "frequency_penalty"):
        _number(getattr(params, name), name, "a number in [-2, 2]", lambda v: -2 <= v <= 2)
    _integer(params.top_k, "top_k", "-1 or 0 (off) or an integer >= 1", lambda v: v >= -1)
    _integer(params.max_tokens, "max_tokens", "an integer >= 1", lambda v: v >= 1)
    _integer(params.min_tokens, "min_tokens", "an integer >= 0", lambda v: v >= 0)
    _integer(params.priority, "priority", "a 64-bit integer", lambda v: -_INT64 <= v < _INT64)
    if params.min_tokens > params.max_tokens:
        raise InvalidParam(
            f"min_tokens ({params.min_tokens}) must be less than or equal to max_tokens ({params.max_tokens}).",
            "min_tokens",
        )
    if params.seed is not None:
        _integer(params.seed, "seed", "a 64-bit integer", lambda v: -_INT64 <= v < _INT64)
    check_token_ids(params.stop_token_ids, vocab_size, "stop_token_ids")
    check_token_ids(list(params.logit_bias), vocab_size, "logit_bias")


def check_room(prompt_tokens: int, body: dict[str, Any], max_model_len: int, prompt_param: str) -> None:
    """vLLM's rule: a max_tokens (or max_completion_tokens) the request sets must fit in the context after the
    prompt, else InvalidParam naming it (the prompt's field when the prompt alone fills the context). Not set,
    it defaults to what is left of the context."""
    name = requested_completion_field(body)
    max_tokens = body.get(name)
    if not _is_int(max_tokens) or prompt_tokens + max_tokens <= max_model_len:
        return
    raise InvalidParam(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). "
        "Please reduce the length of the messages or completion.",
        prompt_param if prompt_tokens >= max_model_len else name,
        code="context_length_exceeded",
    )


def check_token_ids(ids: Any, vocab_size: int | None, param: str) -> None:
    """Token ids are integers in [0, vocab_size) (any integer >= 0 when the vocabulary is not known)."""
    if not isinstance(ids, list):
        raise InvalidParam(f"'{param}' must be an array of token ids.", param)
    for token in ids:
        if not _is_int(token) or token < 0 or (vocab_size is not None and token >= vocab_size):
            size = f"integers in [0, {vocab_size})" if vocab_size is not None else "integers >= 0"
            raise InvalidParam(
                f"Invalid token id {token!r} in '{param}': this model's token ids are {size}.", param
            )


def _number(value: Any, name: str, expected: str, ok: Any) -> None:
    valid = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not valid or not ok(value):
        raise InvalidParam(f"Invalid '{name}': expected {expected}, got {value!r}.", name)


def _integer(value: Any, name: str, expected: str, ok: Any) -> None:
    if not _is_int(value) or not ok(value):
        raise InvalidParam(f"Invalid '{name}': expected {expected}, got {value!r}.", name)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
