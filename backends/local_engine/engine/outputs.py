"""What the engine hands back per request and step; free of torch so the server can import it cheaply."""

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class RequestOutput:
    """What one request gained in one step."""

    seq_id: int
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[TokenLogprob]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    # with the first output of a request that asked for them: each prompt token's logprob (None for the first)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # vLLM's: what ended a "stop" finish: the stop string, the stop token id; None for EOS, a length stop
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def matched_stop(
    token_id: int, stop_string: str | None, stop_token_ids: list[int], eos: bool
) -> int | str | None:
    """vLLM's `stop_reason` of a request that finished with "stop" on `token_id`: the stop string the text
    ended with, else the token id when it is a stop token (and not an end of sequence honoured: `eos`)."""
    if stop_string is not None:
        return stop_string
    return token_id if not eos and token_id in stop_token_ids else None
