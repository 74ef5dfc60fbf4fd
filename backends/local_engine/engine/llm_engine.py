"""The synchronous engine loop: schedule → model runner → sample (and verify proposals) → update sequences.

One `step()` is one forward pass over a continuous batch. It returns, per request that advanced, the
tokens and text produced in that step, so a caller can stream them.
"""

from dataclasses import dataclass, replace
from typing import Any

import torch

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.block_manager import BlockManager
from backends.local_engine.engine.engine_types import (
    Detokenizer,
    DetokenizerFactory,
    EngineCounters,
    ProbsFn,
    Runner,
    SampleAsyncFn,
    SampleFn,
)
from backends.local_engine.engine.logprobs import prompt_chunk_logprobs, token_logprob
from backends.local_engine.engine.outputs import RequestOutput, TokenLogprob, matched_stop
from backends.local_engine.engine.pipeline import PLACEHOLDER, InFlight, pipelinable
from backends.local_engine.engine.request_checks import check_params, check_token_ids
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.scheduler import Scheduler
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence
from backends.local_engine.engine.speculative import (
    AcceptanceGate,
    NgramProposer,
    verify_greedy,
    verify_sampled,
)


@dataclass
class _Request:
    seq: Sequence
    detokenizer: Detokenizer
    generator: torch.Generator | None
    gate: AcceptanceGate
    # prompt logprobs asked for: collected chunk by chunk, sent with the first output
    prompt_logprobs: list[TokenLogprob | None] | None = None


class LLMEngine:
    def __init__(
        self,
        settings: EngineSettings,
        runner: Runner,
        probs_fn: ProbsFn,
        detokenizer: DetokenizerFactory,
        sample_fn: SampleFn | None = None,
        sample_async_fn: SampleAsyncFn | None = None,
        vocab_size: int | None = None,
    ) -> None:
        """`sample_fn`, when given, samples steps without speculative drafts or grammars in one batched
        call (the CUDA engine: one host sync per step); other steps go through `probs_fn`. With
        `sample_async_fn` too (and settings.async_decode), plain decode steps run one ahead of the host
        (pipeline.py). `vocab_size`: prompt and stop token ids past it are refused when a request is added."""
        self.settings = settings
        self.vocab_size = vocab_size
        self.runner = runner
        self.block_manager = BlockManager(
            runner.num_blocks, runner.block_size, settings.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager, settings.max_num_batched_tokens, settings.max_num_seqs,
            settings.lower_priority_prefill_tokens,
        )  # fmt: skip
        self.proposer = (
            NgramProposer(settings.num_speculative_tokens, settings.ngram_min, settings.ngram_max)
            if settings.speculative_ngram
            else None
        )
        self._probs_fn = probs_fn
        self._sample_fn = sample_fn
        self._sample_async_fn = sample_async_fn if settings.async_decode else None
        self._inflight: InFlight | None = None
        self._make_detokenizer = detokenizer
        self._eos = set(runner.eos_token_ids)
        self._requests: dict[int, _Request] = {}
        self._stepping: list[int] | None = None  # the requests of the step under way, once scheduled
        self.counters = EngineCounters()

    # --- requests --------------------------------------------------------------------------------------

    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """Queue a request; ValueError (with a client-facing message) when it cannot fit or is invalid
        (request_checks.InvalidParam: a token id outside the vocabulary, a sampling parameter out of range)."""
        limit = self.settings.max_model_len
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        check_token_ids(prompt_ids, self.vocab_size, "prompt")
        check_params(params, self.vocab_size)
        if len(prompt_ids) >= limit:
            raise ValueError(
                f"This model's maximum context length is {limit} tokens. "
                f"However, your prompt has {len(prompt_ids)} tokens."
            )
        params = replace(params, max_tokens=min(params.max_tokens, limit - len(prompt_ids)))
        if params.min_tokens and not params.ignore_eos:
            params = replace(params, eos_token_ids=tuple(self._eos))
        seq = Sequence(list(prompt_ids), params)
        self.scheduler.add(seq)
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        gate = AcceptanceGate(self.settings.spec_min_acceptance)
        self._requests[seq.seq_id] = _Request(
            seq, self._make_detokenizer(prompt_ids, params), generator, gate
        )
        self.counters.num_prompt_tokens += len(prompt_ids)
        return seq.seq_id

    def sequence(self, seq_id: int) -> Sequence | None:
        """A request's sequence while it is in the engine (the metrics read its scheduling time)."""
        request = self._requests.get(seq_id)
        return request.seq if request is not None else None

    def abort(self, seq_id: int) -> None:
        if self._requests.pop(seq_id, None) is not None:
            self.scheduler.abort(seq_id)

    def fail_step(self) -> list[int]:
        """After step() raised: end the requests of that step (every running one when it failed before its
        batch was known or with a step in flight), freeing their blocks; returns their ids. The others go on."""
        failed = self._stepping
        if failed is None or self._inflight is not None:
            failed = [seq.seq_id for seq in self.scheduler.running]
        self._inflight = self._stepping = None
        for seq_id in failed:
            self.abort(seq_id)
        return failed

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or self._inflight is not None

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    # --- one step --------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        self._stepping = None
        if self._inflight is not None:
            return self._continue_pipeline() if self._can_continue() else self._drain()
        if self.proposer is not None:
            self._propose_drafts()
        scheduled = self.scheduler.schedule().scheduled
        self._stepping = [item.seq.seq_id for item in scheduled]
        if not scheduled:
            return []
        results = [_logits_of(result) for result in self.runner.execute(scheduled)]
        results = [self._prompt_rows(item, logits) for item, logits in zip(scheduled, results, strict=True)]
        sampling = [
            (item, logits) for item, logits in zip(scheduled, results, strict=True) if logits is not None
        ]
        for item, logits in zip(scheduled, results, strict=True):
            if logits is None:  # a prefill chunk that does not reach the end yet
                self._advance_chunk(item.seq, item.num_new_tokens)
        if self._sample_fn is not None and self.proposer is None and _plain(sampling):
            if len(sampling) == len(scheduled) and self._can_start(scheduled):
                self._launch([item for item, _ in sampling], torch.cat([row for _, row in sampling]))
                return []
            return self._sample_batch(sampling)
        all_probs = self._probabilities(sampling)
        return [
            self._advance(item, logits, probs)
            for (item, logits), probs in zip(sampling, all_probs, strict=True)
        ]

    def _prompt_rows(self, item: ScheduledSeq, logits: torch.Tensor | None) -> torch.Tensor | None:
        """A prompt chunk's logits at every position: keep the logprobs of the prompt tokens they predict, and
        pass on only the last row, and only when the chunk ends the prompt (it predicts the first output)."""
        if not item.prompt_logits or logits is None:
            return logits
        seq, request = item.seq, self._requests[item.seq.seq_id]
        found = request.prompt_logprobs if request.prompt_logprobs is not None else [None]
        top = seq.params.prompt_logprobs or 0
        found += prompt_chunk_logprobs(
            logits, seq.token_ids, seq.num_computed_tokens, seq.num_prompt_tokens, top
        )
        request.prompt_logprobs = found
        reaches_end = seq.num_computed_tokens + item.num_new_tokens == len(seq)
        return logits[-1:] if reaches_end else None

    def _sample_batch(self, sampling: list[tuple[ScheduledSeq, torch.Tensor]]) -> list[RequestOutput]:
        """One token per sequence from one batched sampling call."""
        if not sampling:
            return []
        rows = [logits for _, logits in sampling]
        logits = rows[0] if len(rows) == 1 else torch.cat(rows)
        tokens = self._sample_fn(logits, [item.seq for item, _ in sampling])
        outputs = []
        for (item, row), token in zip(sampling, tokens, strict=True):
            self._advance_chunk(item.seq, item.num_new_tokens)
            outputs.append(self._emit(self._requests[item.seq.seq_id], [token], row))
        return outputs

    # --- asynchronous decode (pipeline.py) ------------------------------------------------------------

    def _async_ok(self, seqs: list[Sequence]) -> bool:
        """A decode step of `seqs` may run before the host has seen their last tokens: no waiting request
        can be admitted (none waits, or every slot is held by equal or higher priority), the next step
        cannot preempt, and every request samples on the device alone."""
        accepts = getattr(self.runner, "accepts_device_input", None)
        return (
            self._sample_async_fn is not None
            and not self.scheduler.can_admit()
            and accepts is not None
            and accepts(len(seqs))
            and len(seqs) <= min(self.block_manager.num_free_blocks, self.settings.max_num_batched_tokens)
            and all(pipelinable(seq.params) for seq in seqs)
        )

    def _can_start(self, scheduled: list[ScheduledSeq]) -> bool:
        running = self.scheduler.running
        return (
            len(scheduled) == len(running)
            and all(item.num_new_tokens == 1 and item.num_logits == 1 for item in scheduled)
            and self._async_ok(running)
        )

    def _can_continue(self) -> bool:
        running = self.scheduler.running
        return (
            bool(running)
            and all(self._inflight.has(seq.seq_id) and seq.num_uncomputed_tokens == 1 for seq in running)
            and self._async_ok(running)
        )

    def _launch(self, items: list[ScheduledSeq], logits: torch.Tensor) -> InFlight | None:
        """Sample `items`' next tokens on the device and put the step in flight; returns the step that
        was in flight before (its tokens not yet known on the host)."""
        previous, self._inflight = self._inflight, None
        tokens = self._sample_async_fn(logits, [item.seq for item in items])
        self._inflight = InFlight.start(items, tokens)
        if previous is None:  # the inputs of this step were known tokens: account for them now
            for item in items:
                self._advance_chunk(item.seq, 1)
                item.seq.append_token(PLACEHOLDER)
        return previous

    def _continue_pipeline(self) -> list[RequestOutput]:
        """Launch the next decode step from the tokens still on the device, then emit the previous one's."""
        scheduled = self.scheduler.schedule().scheduled  # every running sequence, one token each
        results = self.runner.execute(scheduled, self._inflight.inputs_for(scheduled))
        previous = self._launch(scheduled, torch.cat([_logits_of(result) for result in results]))
        tokens = self._patch(previous)
        for item in scheduled:  # this step's input tokens are known now: hash blocks with them
            self._advance_chunk(item.seq, 1)
            item.seq.append_token(PLACEHOLDER)
        return [self._emit_known(request, token, pending=1) for request, token in tokens]

    def _drain(self) -> list[RequestOutput]:
        """Wait for the step in flight and emit its tokens; the next step() runs a plain step."""
        previous, self._inflight = self._inflight, None
        return [self._emit_known(request, token, pending=0) for request, token in self._patch(previous)]

    def _patch(self, inflight: InFlight) -> list[tuple["_Request", int]]:
        """Wait for `inflight`'s tokens and write them over the placeholders of the requests still alive."""
        alive = []
        for item, token in zip(inflight.items, inflight.wait(), strict=True):
            request = self._requests.get(item.seq.seq_id)
            if request is not None:  # not finished or aborted since; its placeholder is its last token
                item.seq.token_ids[-1] = token
                alive.append((request, token))
        return alive

    def _emit_known(self, request: "_Request", token_id: int, pending: int) -> RequestOutput:
        """Emit a token already in token_ids, followed by `pending` placeholders of the step in flight."""
        seq = request.seq
        out = RequestOutput(
            seq.seq_id, [token_id], "", [], None, seq.num_prompt_tokens, seq.num_cached_tokens, 0
        )
        out.prompt_logprobs, request.prompt_logprobs = request.prompt_logprobs, None
        out.finish_reason = self._stop_reason(seq, token_id)
        if out.finish_reason is None:
            out.new_text = request.detokenizer.add(token_id)
            out.finish_reason = self._length_reason(request, pending)
        if out.finish_reason is not None:
            del seq.token_ids[len(seq.token_ids) - pending :]
            out.new_text += request.detokenizer.flush()
            self._finish(request, out, token_id)
            pending = 0
        out.num_output_tokens = len(seq.output_ids) - pending
        self.counters.num_generation_tokens += 1
        return out

    def _advance_chunk(self, seq: Sequence, num_computed: int) -> None:
        seq.num_computed_tokens += num_computed
        self.block_manager.cache_full_blocks(seq)

    def _probabilities(self, sampling: list[tuple[ScheduledSeq, torch.Tensor]]) -> list[torch.Tensor]:
        """Every logits row's final distribution, in one batched call; row i of a sequence sees drafts < i."""
        params, prompts, outputs, sizes = [], [], [], []
        for item, logits in sampling:
            seq = item.seq
            first = len(seq) - seq.num_draft_tokens
            for row in range(len(logits)):
                params.append(seq.params)
                prompts.append(seq.token_ids[: seq.num_prompt_tokens])
                outputs.append(seq.token_ids[seq.num_prompt_tokens : first + row])
            sizes.append(len(logits))
        if not sizes:
            return []
        probs = self._probs_fn(torch.cat([logits for _, logits in sampling]), params, prompts, outputs)
        return list(probs.cpu().split(sizes))  # verification reads them row by row, with CPU generators

    def _propose_drafts(self) -> None:
        for seq in self.scheduler.running:
            allowed = self._requests[seq.seq_id].gate.allows(len(seq.output_ids))
            if allowed and seq.num_uncomputed_tokens == 1 and not seq.num_draft_tokens:
                room = seq.params.max_tokens - len(seq.output_ids) - 1
                drafts = self.proposer.propose(seq.token_ids, limit=room)
                seq.token_ids.extend(drafts)
                seq.num_draft_tokens = len(drafts)

    def _advance(self, item: ScheduledSeq, logits: torch.Tensor, probs: torch.Tensor) -> RequestOutput:
        seq = item.seq
        drafts = seq.token_ids[len(seq) - seq.num_draft_tokens :]
        request = self._requests[seq.seq_id]
        if seq.params.greedy:
            new_tokens = verify_greedy(drafts, probs)
        else:
            new_tokens = verify_sampled(drafts, probs, request.generator)
        accepted = len(new_tokens) - 1
        self.counters.num_draft_tokens += len(drafts)
        self.counters.num_accepted_tokens += accepted
        seq.trim_drafts()
        request.gate.record(len(drafts), accepted, len(seq.output_ids))
        self._advance_chunk(seq, item.num_new_tokens - (len(drafts) - accepted))
        return self._emit(request, new_tokens, logits)

    def _emit(self, request: _Request, new_tokens: list[int], logits: torch.Tensor) -> RequestOutput:
        seq = request.seq
        out = RequestOutput(seq.seq_id, [], "", [], None, seq.num_prompt_tokens, seq.num_cached_tokens, 0)
        out.prompt_logprobs, request.prompt_logprobs = request.prompt_logprobs, None
        for index, token_id in enumerate(new_tokens):
            seq.append_token(token_id)
            out.new_token_ids.append(token_id)
            if seq.params.logprobs:
                out.new_logprobs.append(token_logprob(logits[index], token_id, seq.params.top_logprobs))
            out.finish_reason = self._stop_reason(seq, token_id)
            if out.finish_reason is None:
                out.new_text += request.detokenizer.add(token_id)
                out.finish_reason = self._length_reason(request)
            if out.finish_reason is not None:
                out.new_text += request.detokenizer.flush()
                self._finish(request, out, token_id)
                break
        out.num_output_tokens = len(seq.output_ids)
        self.counters.num_generation_tokens += len(out.new_token_ids)
        return out

    def _stop_reason(self, seq: Sequence, token_id: int) -> str | None:
        if len(seq.output_ids) <= seq.params.min_tokens:  # the sampler held EOS back; a draft may not
            return None
        is_eos = token_id in self._eos and not seq.params.ignore_eos
        return "stop" if is_eos or token_id in seq.params.stop_token_ids else None

    def _length_reason(self, request: _Request, pending: int = 0) -> str | None:
        """`pending`: placeholders of a step in flight at the end of token_ids, not counted."""
        seq = request.seq
        if request.detokenizer.stopped:
            return "stop"
        produced = len(seq.output_ids) - pending
        if produced >= seq.params.max_tokens or len(seq) - pending >= self.settings.max_model_len:
            return "length"
        return None

    def _finish(self, request: _Request, out: RequestOutput, token_id: int) -> None:
        """End the request on `token_id`, with vLLM's stop_reason: the stop string or stop token that ended it."""
        params, stop_string = request.seq.params, getattr(request.detokenizer, "stop_string", None)
        if out.finish_reason == "stop":
            eos = token_id in self._eos and not params.ignore_eos
            out.stop_reason = matched_stop(token_id, stop_string, params.stop_token_ids, eos)
        self.scheduler.finish(request.seq, out.finish_reason)
        del self._requests[request.seq.seq_id]


def _plain(sampling: list[tuple[ScheduledSeq, torch.Tensor]]) -> bool:
    """No drafts to verify and no grammar: one plain next token per row."""
    return all(
        item.num_logits == 1 and not item.seq.num_draft_tokens and item.seq.params.constraint is None
        for item, _ in sampling
    )


def _logits_of(result: Any) -> torch.Tensor | None:
    """The runner's logits for one scheduled sequence: a [num_logits, vocab] tensor, or None."""
    logits = getattr(result, "logits", result)
    if logits is None:
        return None
    return logits if logits.dim() == 2 else logits.unsqueeze(0)
