"""Per-request generation settings, as the OpenAI API names them."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0  # vLLM's: no EOS, stop token or stop string before this many output tokens
    eos_token_ids: tuple[int, ...] = ()  # the model's, filled in by the engine: what min_tokens holds back
    include_stop_str_in_output: bool = False  # vLLM's: keep the stop string that ended the text
    skip_special_tokens: bool = True  # vLLM's: special tokens' text is left out of the output
    prompt_logprobs: int | None = None  # the prompt tokens' logprobs with this many alternatives (None: off)
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit (OpenAI's)
    # vLLM's `priority` (its --scheduling-policy priority): lower is served first and preempted last; ties go
    # by arrival, so all 0 (the default) is first come, first served
    priority: int = 0
    constraint: Any = None  # structured.JsonConstraint: masks what a response_format forbids

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0
