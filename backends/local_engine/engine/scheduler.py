"""Continuous batching: which sequences compute how many tokens this step. Sequences and blocks only.

Each step has one token budget. Running decodes go first, then the next prefill chunk of running
sequences, then new requests from the waiting queue, so a long prompt is split across steps and never
stalls the decodes.

Order is vLLM's `--scheduling-policy priority`: every sequence has a key (priority, arrival), a lower
priority value served first, arrival breaking ties (all priorities 0 is first come, first served). The
waiting queue is served in key order and the running list is kept in key order. When blocks run out the
running sequence with the largest key (lowest priority, latest arrival) is preempted: its blocks are freed
(recompute later) and it goes back to the waiting queue at its key's place. A sequence that needs blocks is
never given them by preempting one with a smaller key than its own: it preempts itself first. A waiting
sequence that does not fit preempts running ones of strictly lower priority (larger value) when that frees
enough, never one of its own or higher priority.
"""

import time
from bisect import insort
from dataclasses import dataclass, field

from backends.local_engine.engine.block_manager import BlockManager
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        lower_priority_prefill_tokens: int | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        # prefill tokens a step gives sequences less urgent than the most urgent one present (None: no cap)
        self.lower_priority_prefill_tokens = lower_priority_prefill_tokens
        self.waiting: list[Sequence] = []  # in key order: the next to admit first
        self.running: list[Sequence] = []  # in key order: the first to preempt last
        self.num_preemptions = 0
        self.scheduled_tokens = 0  # tokens of every batch scheduled so far (the engine's step metrics)

    def add(self, seq: Sequence) -> None:
        """Queue a request; one that could never fit the whole KV pool is refused (ValueError)."""
        most_tokens = len(seq) + seq.params.max_tokens
        if self.block_manager.blocks_for(most_tokens) > self.block_manager.num_blocks:
            capacity = self.block_manager.num_blocks * self.block_manager.block_size
            raise ValueError(
                f"prompt + max_tokens = {most_tokens} tokens exceeds the KV cache ({capacity} tokens)"
            )
        seq.status = SequenceStatus.WAITING
        insort(self.waiting, seq, key=_key)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def can_admit(self) -> bool:
        """Whether the next step may admit a waiting sequence: one waits and a slot is free, or it outranks
        a running one (priority preemption). False while every slot is held by equal or higher priority:
        the next steps are the running sequences' alone (the CUDA engine pipelines them, pipeline.py)."""
        if not self.waiting:
            return False
        if len(self.running) < self.max_num_seqs:
            return True
        return bool(self.running) and self.waiting[0].params.priority < self.running[-1].params.priority

    def schedule(self) -> SchedulerOutput:
        """This step's batch, under one token budget: the decode section, then the prefill section."""
        step = _Step(self.max_num_batched_tokens)
        decodes = [s for s in self.running if _is_decoding(s)]
        prefills = [s for s in self.running if not _is_decoding(s)]

        # Decode: each running sequence with one token (plus its speculative drafts) left to compute.
        for seq in decodes:
            if seq.status is SequenceStatus.RUNNING and step.budget > 0:  # not preempted meanwhile
                self._grow_or_preempt(seq, step)

        # Prefill: the next chunk of prompts already running, then new requests from the waiting queue
        # while budget, sequence slots and free blocks last (none after a preemption: blocks are short).
        # Sequences less urgent than the most urgent one present share lower_priority_prefill_tokens a step,
        # so a batch prompt's chunks do not lengthen an interactive sequence's steps.
        lower = _LowerShare(self.lower_priority_prefill_tokens, [*self.running, *self.waiting[:1]])
        for seq in prefills:
            if seq.status is SequenceStatus.RUNNING and step.budget > 0:  # not preempted meanwhile
                cap = lower.cap(seq, step.budget)
                if cap > 0:
                    before = step.budget
                    self._grow_or_preempt(seq, step, cap)
                    lower.spend(seq, before - step.budget)
        if not step.output.preempted:
            self._admit_waiting(step, lower)
        self.scheduled_tokens += step.output.num_batched_tokens
        return step.output

    def _admit_waiting(self, step: "_Step", lower: "_LowerShare") -> None:
        """New requests from the waiting queue, in key order, while budget, a slot and blocks last."""
        while self.waiting and step.budget > 0:
            seq = self.waiting[0]
            cap = lower.cap(seq, step.budget)
            if cap <= 0:
                break
            # a prompt whose logprobs are asked for is computed whole: cached blocks would skip positions
            wants_all = seq.params.prompt_logprobs is not None
            matched = [] if wants_all else self.block_manager.match_prefix(seq.token_ids)
            num_new = min(len(seq) - len(matched) * self.block_manager.block_size, cap)
            needed = self.block_manager.num_new_blocks_to_admit(seq, matched, num_new)
            if not self._make_room(seq, needed, step):
                break
            self.waiting.pop(0)
            resumed = seq.first_scheduled is not None  # a preempted one keeps its first
            if not resumed:  # the end of its queue time
                seq.first_scheduled = time.monotonic()
            self.block_manager.admit(seq, matched, resumed)
            if not seq.output_ids:
                seq.num_cached_tokens = seq.num_computed_tokens
            self.block_manager.grow(seq, num_new)
            seq.status = SequenceStatus.RUNNING
            insort(self.running, seq, key=_key)
            step.add(seq, num_new)
            lower.spend(seq, num_new)

    def _make_room(self, seq: Sequence, needed_blocks: int, step: "_Step") -> bool:
        """Whether waiting `seq` can be admitted: a sequence slot and `needed_blocks` free blocks, making
        them by preempting running sequences of strictly lower priority (largest key first) when that
        is enough; none is preempted when it is not."""
        free = self.block_manager.num_free_blocks
        slots = self.max_num_seqs - len(self.running)
        if needed_blocks <= free and slots > 0:
            return True
        victims = []
        for victim in reversed(self.running):
            if victim.params.priority <= seq.params.priority:
                break
            victims.append(victim)
            free += self.block_manager.num_exclusive_blocks(victim)
            slots += 1
            if needed_blocks <= free and slots > 0:
                for chosen in victims:
                    self._preempt(chosen, step)
                return True
        return False

    def _grow_or_preempt(self, seq: Sequence, step: "_Step", cap: int | None = None) -> None:
        """Blocks for the tokens of `seq` that fit the budget (and `cap`); short of blocks, the running
        sequence with the largest key is preempted (possibly `seq` itself, which then waits)."""
        num_new = self._fit_to_budget(seq, step.budget if cap is None else min(cap, step.budget))
        if len(seq.block_table) * self.block_manager.block_size >= seq.num_computed_tokens + num_new:
            step.add(seq, num_new)  # its blocks already hold the chunk (most decode steps)
            return
        while not self.block_manager.can_grow(seq, num_new):
            victim = self.running[-1]
            self._preempt(victim, step)
            if victim is seq:
                return
        self.block_manager.grow(seq, num_new)
        step.add(seq, num_new)

    def _fit_to_budget(self, seq: Sequence, budget: int) -> int:
        """Tokens to compute for `seq`; speculative proposals that do not fit are dropped."""
        if seq.num_uncomputed_tokens > budget and seq.num_draft_tokens:
            seq.trim_drafts(keep=max(0, budget - (seq.num_uncomputed_tokens - seq.num_draft_tokens)))
        return min(seq.num_uncomputed_tokens, budget)

    def _preempt(self, seq: Sequence, step: "_Step") -> None:
        step.remove(seq)
        seq.trim_drafts()
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        insort(self.waiting, seq, key=_key)
        self.num_preemptions += 1
        step.output.preempted.append(seq)

    # --- after the step -------------------------------------------------------------------------------

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence (finished or aborted) and free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.trim_drafts()
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def abort(self, seq_id: int) -> Sequence | None:
        for seq in [*self.running, *self.waiting]:
            if seq.seq_id == seq_id:
                self.finish(seq, "abort")
                return seq
        return None


def _key(seq: Sequence) -> tuple[int, int]:
    """Scheduling order: priority (lower first), then arrival (sequence ids count up as requests come)."""
    return seq.params.priority, seq.seq_id


def _is_decoding(seq: Sequence) -> bool:
    return seq.num_uncomputed_tokens <= 1 + seq.num_draft_tokens


class _LowerShare:
    """The prefill tokens left this step for sequences less urgent than the most urgent one present."""

    def __init__(self, tokens: int | None, present: list[Sequence]) -> None:
        self._left = tokens
        self._urgent = min((s.params.priority for s in present), default=0)

    def cap(self, seq: Sequence, budget: int) -> int:
        if self._left is None or seq.params.priority <= self._urgent:
            return budget
        return min(budget, self._left)

    def spend(self, seq: Sequence, tokens: int) -> None:
        if self._left is not None and seq.params.priority > self._urgent:
            self._left -= tokens


class _Step:
    """The batch being built: scheduled chunks and the token budget left."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.output = SchedulerOutput()

    def add(self, seq: Sequence, num_new: int) -> None:
        reaches_end = seq.num_computed_tokens + num_new == len(seq)
        if seq.params.prompt_logprobs is not None and not seq.output_ids:  # every position of the prompt
            self.output.scheduled.append(ScheduledSeq(seq, num_new, num_new, prompt_logits=True))
        else:
            num_logits = 1 + seq.num_draft_tokens if reaches_end else 1
            self.output.scheduled.append(ScheduledSeq(seq, num_new, num_logits))
        self.budget -= num_new

    def remove(self, seq: Sequence) -> None:
        for item in self.output.scheduled:
            if item.seq is seq:
                self.output.scheduled.remove(item)
                self.budget += item.num_new_tokens
                return
