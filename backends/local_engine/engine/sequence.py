"""One request's tokens and progress; shared by the scheduler, block manager and model runner."""

from dataclasses import dataclass, field
from enum import Enum, auto
from itertools import count

from backends.local_engine.engine.sampling_params import SamplingParams

_ids = count()


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(eq=False)
class Sequence:
    token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    block_table: list[int] = field(default_factory=list)
    output_logprobs: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    num_draft_tokens: int = 0  # speculative proposals at the end of token_ids, not yet verified
    first_scheduled: float | None = None  # time.monotonic() when it first left the waiting queue (metrics)

    def __post_init__(self) -> None:
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def trim_drafts(self, keep: int = 0) -> None:
        """Drop all but the first `keep` unverified speculative tokens."""
        drop = self.num_draft_tokens - min(keep, self.num_draft_tokens)
        if drop:
            del self.token_ids[-drop:]
        self.num_draft_tokens -= drop


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: compute `num_new_tokens` tokens from `num_computed_tokens` on.

    The runner returns logits for the last `num_logits` positions when the chunk reaches the end of the
    sequence's tokens (num_logits > 1 when verifying speculative proposals), and for every position of the
    chunk when `prompt_logits` (a prompt whose tokens' logprobs were asked for).
    """

    seq: Sequence
    num_new_tokens: int
    num_logits: int = 1
    prompt_logits: bool = False
