"""What the engine loop (engine.py) is given: the model runner, the detokenizer and the sampling functions."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence


@dataclass
class EngineCounters:
    """The engine's running totals, read by the metrics at scrape time."""

    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0


class Runner(Protocol):
    num_blocks: int
    block_size: int
    eos_token_ids: Any

    def execute(self, batch: list[ScheduledSeq], input_tokens: Any = None) -> list[Any]:
        """Logits per scheduled sequence; `input_tokens` (a device tensor, one per sequence of a decode
        batch) replaces the last token of each, for runners whose `accepts_device_input` says so."""
        ...


class Detokenizer(Protocol):
    """Incremental text for one request; `stopped` once a stop string appeared (text cut before it). One that
    has stop strings says which ended the text in a `stop_string` attribute (vLLM's stop_reason); one without
    (bench/lib/engine_gpu_models.py's) may leave it out."""

    stopped: bool

    def add(self, token_id: int) -> str: ...

    def flush(self) -> str:
        """Text held back so far (a possible stop string's start, pending bytes), at the end."""
        ...


# logits [N, vocab], params, prompt ids and output ids per row -> the final sampling distributions [N, vocab]
ProbsFn = Callable[[torch.Tensor, list[SamplingParams], list[list[int]], list[list[int]]], torch.Tensor]
# logits [N, vocab] and the sequence of each row -> one next token per row (device_sampler.DeviceSampler)
SampleFn = Callable[[torch.Tensor, list[Sequence]], list[int]]
# the same, left on the device as an int64 tensor (DeviceSampler.sample_async)
SampleAsyncFn = Callable[[torch.Tensor, list[Sequence]], torch.Tensor]
DetokenizerFactory = Callable[[list[int], SamplingParams], Detokenizer]
