"""Asynchronous decode: one decode step in flight while the host prepares the next (CUDA engines).

In a plain decode step the GPU waits while the host reads the sampled tokens, emits them, schedules the
next step and builds its inputs (0.2-0.35 ms a step on the H200 host, 4-8 % of an 8B step and ~20 % of
a 1B one; studies/README.md). Here a step's sampled tokens stay on the device and the next decode step
reads them there (the runner copies them into its input ids on the device), so the engine launches step
N+1 before it has seen step N's tokens. It learns them through a pinned buffer filled by a copy queued
right after step N's sampling: waiting on that copy's event waits for step N only, not for step N+1,
which then runs while the host emits step N's tokens.

Until its token is known, a sequence of an in-flight step carries PLACEHOLDER at the end of its
token_ids; the engine writes the real token there before anything reads it (block hashes included).
A sequence that finishes at step N has step N+1's row thrown away. The engine pipelines only plain
decode batches (no waiting requests, grammars, logprobs, penalties or speculative drafts) and drains
the step in flight before any other kind of step.
"""

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from backends.local_engine.engine.sampler import _has_penalty
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.sequence import ScheduledSeq

PLACEHOLDER = 0  # stands in for a token that is still on the device


@dataclass
class InFlight:
    """A launched decode step: its batch and its sampled tokens (on the device, and on their way back)."""

    items: list[ScheduledSeq]
    tokens: Tensor  # [B] int64, on the device
    host: Tensor  # [B] int64, pinned, filled by a copy queued after the sampling
    ready: Any  # torch.cuda.Event recorded after that copy (None on the CPU, where the copy is done)
    seq_ids: frozenset[int] = frozenset()

    @classmethod
    def start(cls, items: list[ScheduledSeq], tokens: Tensor) -> "InFlight":
        cuda = tokens.is_cuda
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=cuda)
        host.copy_(tokens, non_blocking=cuda)
        ready = None
        if cuda:
            ready = torch.cuda.Event()
            ready.record()
        return cls(items, tokens, host, ready, frozenset(item.seq.seq_id for item in items))

    def wait(self) -> list[int]:
        """The step's tokens, once its sampling is done (later steps may still be running)."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()

    def inputs_for(self, items: list[ScheduledSeq]) -> Tensor:
        """The sampled tokens in the order of `items`, each of which was in this step."""
        rows = {item.seq.seq_id: row for row, item in enumerate(self.items)}
        index = [rows[item.seq.seq_id] for item in items]
        if index == list(range(len(self.items))):
            return self.tokens
        picks = torch.tensor(index, dtype=torch.long)
        if self.tokens.is_cuda:
            picks = picks.pin_memory().to(self.tokens.device, non_blocking=True)
        return self.tokens.index_select(0, picks)

    def has(self, seq_id: int) -> bool:
        return seq_id in self.seq_ids


def pipelinable(params: SamplingParams) -> bool:
    """Whether a request's next token may be sampled before the host knows its previous one: its sampling
    must not read the output tokens on the host (penalties, grammars) and it asks for no logprobs."""
    return params.constraint is None and not params.logprobs and not _has_penalty(params)
