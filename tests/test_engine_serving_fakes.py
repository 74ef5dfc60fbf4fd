"""A deterministic stand-in for the model side, for engine-loop tests: next token = f(previous tokens)."""

from dataclasses import dataclass

import torch

from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.sequence import ScheduledSeq

VOCAB = 64
EOS = 0


def next_token(tokens: list[int]) -> int:
    """Cycles through a short pattern so n-gram speculation has something to find."""
    return 1 + (tokens[-1] * 5 + 3) % 13


@dataclass
class FakeStepOutput:
    logits: torch.Tensor | None


class FakeRunner:
    """`device_input`: decode steps may take their input tokens as a tensor (like the CUDA runner's)."""

    def __init__(self, num_blocks: int = 64, block_size: int = 4, device_input: bool = False) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.eos_token_ids = (EOS,)
        self.batches: list[list[tuple[int, int]]] = []
        self.device_input = device_input
        self.device_input_steps = 0

    def accepts_device_input(self, num_seqs: int) -> bool:
        return self.device_input

    def execute(
        self, batch: list[ScheduledSeq], input_tokens: torch.Tensor | None = None
    ) -> list[FakeStepOutput]:
        self.batches.append([(item.seq.seq_id, item.num_new_tokens) for item in batch])
        if input_tokens is None:
            return [self._one(item) for item in batch]
        assert self.device_input and all(item.num_new_tokens == 1 for item in batch)
        self.device_input_steps += 1
        return [self._one(item, int(token)) for item, token in zip(batch, input_tokens, strict=True)]

    def _one(self, item: ScheduledSeq, last: int | None = None) -> FakeStepOutput:
        seq = item.seq
        assert len(seq.block_table) * self.block_size >= seq.num_computed_tokens + item.num_new_tokens
        end = seq.num_computed_tokens + item.num_new_tokens
        if end < len(seq) and not item.prompt_logits:
            return FakeStepOutput(None)
        tokens = seq.token_ids if last is None else [*seq.token_ids[:-1], last]
        first = end - item.num_logits
        rows = [self._row(tokens[: first + i + 1]) for i in range(item.num_logits)]
        return FakeStepOutput(torch.stack(rows))

    @staticmethod
    def _row(context: list[int]) -> torch.Tensor:
        logits = torch.linspace(0.0, 1.0, VOCAB)
        logits[next_token(context)] = 3.0
        return logits


def fake_probs(
    logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]]
) -> torch.Tensor:
    temperatures = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params])
    return torch.softmax(logits / temperatures[:, None], dim=-1)


class FakeDetokenizer:
    def __init__(self, prompt_ids: list[int], params: SamplingParams) -> None:
        self.stop = params.stop
        self.text = ""
        self.stopped = False
        self.stop_string: str | None = None

    def add(self, token_id: int) -> str:
        before = len(self.text)
        self.text += f"<{token_id}>"
        for stop in self.stop:
            if stop in self.text:
                self.text = self.text[: self.text.index(stop)]
                self.stopped, self.stop_string = True, stop
        return self.text[before:]

    def flush(self) -> str:
        return ""
