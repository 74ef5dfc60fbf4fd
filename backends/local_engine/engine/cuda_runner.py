"""The CUDA side of the model runner: one host→device copy per step, CUDA graphs for decode steps.

A step's integer inputs (token ids, positions, slot mapping, context lengths, query offsets, block tables,
logit rows) are written by the host into one pinned buffer and copied to the device in one transfer.
Decode steps (one new token and one logit per sequence) of up to the largest bucket run by replaying the
CUDA graph captured for the smallest bucket that holds them: the graph reads its inputs from static
device buffers, and padding rows write their K/V to a scratch block no sequence owns. Prefill and mixed
steps replay a graph of the smallest (tokens, sequences) shape holding them, one padding sequence owning
the extra tokens: up to 256 tokens and 8 sequences, or, with `mixed_graphs`, up to the step budget and
max_num_seqs (graphs of more than 8 sequences end at the selected hidden rows, and the logits run after
the replay, so that 100 graphs do not each keep a [sequences, vocab] output). Other steps (speculative
verification, prompt logprobs) run eagerly with the same kernels.
"""

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from backends.local_engine.engine.sequence import ScheduledSeq
from backends.local_engine.model.attention_cuda import CudaAttentionMetadata
from backends.local_engine.model.kv_cache import KVCache
from backends.local_engine.model.llama import LlamaModel

_BUCKET_STEPS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128)
# Small prefill / mixed steps replayed from graphs too: (tokens, sequences incl. one padding sequence).
# Eager steps are bound by launching ~10 kernels per layer from Python; a prefix-cached prompt's tail
# (a few dozen tokens) is such a step.
PREFILL_TOKENS = (16, 32, 64, 128, 256)
PREFILL_SEQS = (2, 4, 8)
# mixed graphs: token buckets every MIXED_TOKENS_STEP past PREFILL_TOKENS (at most 255 padding rows), up to
# MIXED_MAX_TOKENS: larger steps are device-bound (an 8B 2,048-token step: 61.5 ms with or without a graph)
MIXED_TOKENS_STEP = 256
MIXED_MAX_TOKENS = 2048


def graph_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes a decode graph is captured for: powers of two, then steps of 16, up to max_num_seqs."""
    buckets = [b for b in _BUCKET_STEPS if b < max_num_seqs]
    size = 128 + 32
    while size < max_num_seqs:
        buckets.append(size)
        size += 32
    return [*buckets, max_num_seqs]


def bucket_for(num_seqs: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding `num_seqs` sequences, or None when it exceeds the largest."""
    index = bisect_left(buckets, num_seqs)
    return buckets[index] if index < len(buckets) else None


def prefill_buckets(max_tokens: int, max_num_seqs: int, mixed: bool) -> tuple[list[int], list[int]]:
    """Token and sequence buckets of the prefill graphs: PREFILL_TOKENS x PREFILL_SEQS, and with `mixed`
    every MIXED_TOKENS_STEP tokens up to `max_tokens` (the step budget; at most MIXED_MAX_TOKENS) and powers
    of two up to max_num_seqs + 1 (the padding sequence's slot)."""
    tokens, seqs = list(PREFILL_TOKENS), list(PREFILL_SEQS)
    if mixed:
        max_tokens = min(max_tokens, MIXED_MAX_TOKENS)
        tokens += list(range(2 * MIXED_TOKENS_STEP, max_tokens, MIXED_TOKENS_STEP))
        tokens += [max_tokens] if max_tokens > tokens[-1] else []
        while seqs[-1] * 2 < max_num_seqs + 1:
            seqs.append(seqs[-1] * 2)
        seqs += [max_num_seqs + 1] if max_num_seqs + 1 > seqs[-1] else []
    return tokens, seqs


def head_in_graph(seqs: int) -> bool:
    """Whether a prefill graph of `seqs` sequence slots ends at the logits; larger ones end at the logit rows'
    hidden states (a [seqs, vocab] output per graph would add up over ~100 graphs)."""
    return seqs <= PREFILL_SEQS[-1]


def prefill_shapes(tokens: list[int], seqs: list[int]) -> list[tuple[int, int]]:
    """The (tokens, sequences) graphs to capture: no more sequence slots than a step of that many tokens can
    use (one token each, plus the padding sequence), rounded up to a bucket."""
    return [(t, s) for t in tokens for s in seqs if s <= (bucket_for(t + 1, seqs) or seqs[-1])]


def prefill_bucket(
    tokens: int, seqs: int, rows: int, buckets: tuple[list[int], list[int]]
) -> tuple[int, int] | None:
    """The smallest (tokens, sequences) prefill graph for a step (one sequence slot stays for padding)."""
    t = bucket_for(tokens, buckets[0])
    s = bucket_for(seqs + 1, buckets[1])
    return None if t is None or s is None or rows > s else (t, s)


@dataclass
class HostStep:
    """A step's integer inputs, built on the host (lists of Python ints)."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]
    context_lens: list[int]
    query_start: list[int]
    logit_rows: list[int]
    tables: list[list[int]]
    max_q: int

    @property
    def is_decode(self) -> bool:
        return self.max_q == 1 and len(self.logit_rows) == len(self.input_ids)


def padded_step(step: HostStep, tokens: int, seqs: int, pad_slot: int, block_size: int) -> HostStep:
    """`step` grown to `tokens` tokens in `seqs` sequences: one padding sequence owns the extra tokens
    (its K/V go to `pad_slot`, its context is read from the scratch block), the rest are empty."""
    pad = tokens - len(step.input_ids)
    scratch = pad_slot // block_size
    empty = seqs - len(step.context_lens) - 1
    return HostStep(
        step.input_ids + [0] * pad,
        step.positions + [0] * pad,
        step.slots + [pad_slot] * pad,
        step.context_lens + [pad] + [0] * empty,
        step.query_start + [tokens] * (1 + empty),
        step.logit_rows,
        step.tables + [[scratch] * -(-pad // block_size)] + [[]] * empty,
        tokens,
    )


def host_step(batch: list[ScheduledSeq], block_size: int) -> HostStep:
    """Flatten the scheduled chunks: each sequence's new tokens, their slots, and the rows needing logits."""
    step = HostStep([], [], [], [], [0], [], [], 1)
    for item in batch:
        seq, start = item.seq, item.seq.num_computed_tokens
        end = start + item.num_new_tokens
        table = seq.block_table
        first = len(step.input_ids)
        if end == len(seq.token_ids) or item.prompt_logits:
            step.logit_rows.extend(
                range(first + item.num_new_tokens - item.num_logits, first + item.num_new_tokens)
            )
        step.input_ids.extend(seq.token_ids[start:end])
        step.positions.extend(range(start, end))
        step.slots.extend(table[p // block_size] * block_size + p % block_size for p in range(start, end))
        step.context_lens.append(end)
        step.query_start.append(first + item.num_new_tokens)
        step.tables.append(table)
        step.max_q = max(step.max_q, item.num_new_tokens)
    return step


class StepBuffers:
    """A pinned host buffer and a device buffer of int64 words; a step's inputs are views into them.

    Layout for (tokens t, sequences s, table width w): ids, positions, slots, logit rows (int64, t each),
    then an int32 region: context lengths [s], query offsets [s + 1], block tables [s, w]. Only the used
    prefix is copied, in one transfer.
    """

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.host = torch.zeros(capacity, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.device = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.host_np = self.host.numpy()
        self.copied = torch.cuda.Event() if device.type == "cuda" else None
        self.pending = False

    @staticmethod
    def words(t: int, s: int, w: int) -> int:
        return 4 * t + -(-(2 * s + 1 + s * w) // 2)

    def views(self, t: int, s: int, w: int) -> dict[str, Tensor]:
        buffer = self.device
        small = buffer[4 * t : self.words(t, s, w)].view(torch.int32)
        return {
            "input_ids": buffer[:t],
            "positions": buffer[t : 2 * t],
            "slots": buffer[2 * t : 3 * t],
            "logit_rows": buffer[3 * t : 4 * t],
            "context_lens": small[:s],
            "query_start": small[s : 2 * s + 1],
            "tables": small[2 * s + 1 : 2 * s + 1 + s * w].view(s, w),
        }

    def fill(self, step: HostStep, t: int, s: int, w: int, pad_slot: int, used: int | None = None) -> None:
        """Write `step` padded to (t, s, w) (padding rows decode one token into `pad_slot`); copy it over.
        With `used`, only the first `used` block-table rows are written and copied (a decode graph of that
        bucket reads no more: the largest bucket's table is most of the buffer)."""
        n, rows, num = len(step.input_ids), len(step.logit_rows), len(step.context_lens)
        used = s if used is None else used
        size = 4 * t + -(-(2 * s + 1 + used * w) // 2)
        if self.pending:  # the previous step's copy may still be reading the pinned buffer
            self.copied.synchronize()
        host = self.host_np
        host[: 4 * t] = 0
        host[:n] = step.input_ids
        host[t : t + n] = step.positions
        host[2 * t : 2 * t + n] = step.slots
        host[2 * t + n : 3 * t] = pad_slot
        host[3 * t : 3 * t + rows] = step.logit_rows
        small = host[4 * t : size].view(np.int32)
        small[:num] = step.context_lens
        small[num:s] = 1
        small[s : s + num + 1] = step.query_start
        small[s + num + 1 : 2 * s + 1] = np.arange(n + 1, n + 1 + s - num)
        tables = small[2 * s + 1 : 2 * s + 1 + used * w].reshape(used, w)
        tables[:] = 0
        for row, table in enumerate(step.tables[:used]):
            tables[row, : len(table)] = table[:w]
        self.device[:size].copy_(self.host[:size], non_blocking=True)
        if self.copied is not None:
            self.copied.record()
            self.pending = True


def metadata(
    views: dict[str, Tensor], page_size: int, max_q: int, seqs: int, tokens: int
) -> CudaAttentionMetadata:
    return CudaAttentionMetadata(
        views["slots"][:tokens], views["tables"][:seqs], views["context_lens"][:seqs],
        views["query_start"][: seqs + 1], max_q, page_size,
    )  # fmt: skip


class CudaStepRunner:
    """Runs steps of `model` on CUDA; decode steps through per-bucket CUDA graphs (captured by `capture`)."""

    def __init__(
        self, model: LlamaModel, kv_cache: KVCache, block_size: int, max_num_seqs: int, max_model_len: int,
        max_num_batched_tokens: int, mixed_graphs: bool = False,
    ) -> None:  # fmt: skip
        self.model, self.kv_cache, self.block_size = model, kv_cache, block_size
        self.device = kv_cache.pool.device
        self.width = -(-max_model_len // block_size)
        self.pad_slot = (kv_cache.num_blocks - 1) * block_size  # the last block is reserved as scratch
        self.buckets = graph_buckets(max_num_seqs)
        largest = self.buckets[-1]
        self.decode_shape = (largest, largest, self.width)
        self.decode_buffers = StepBuffers(StepBuffers.words(*self.decode_shape), self.device)
        self.decode_views = self.decode_buffers.views(*self.decode_shape)
        tokens = max(max_num_batched_tokens, largest)
        self.eager_buffers = StepBuffers(StepBuffers.words(tokens, max_num_seqs, self.width), self.device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.prefill_sizes = prefill_buckets(max_num_batched_tokens, max_num_seqs, mixed_graphs)
        words = StepBuffers.words(self.prefill_sizes[0][-1], self.prefill_sizes[1][-1], self.width)
        self.prefill_buffers = StepBuffers(words, self.device)
        self.prefill_graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}

    def capture(self) -> None:
        """Capture one decode graph per bucket, largest first, all sharing one memory pool."""
        pool = None
        empty = HostStep([], [], [], [], [0], [], [], 1)
        for bucket in reversed(self.buckets):
            self.decode_buffers.fill(empty, *self.decode_shape, self.pad_slot)
            self._decode_forward(bucket)  # warm-up: compiles kernels, sets up cuBLAS workspaces
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._decode_forward(bucket)
            pool = graph.pool()
            self.graphs[bucket] = (graph, logits)
        for tokens, seqs in reversed(prefill_shapes(*self.prefill_sizes)):
            shape = (tokens, seqs, self.width)
            self.prefill_buffers.fill(padded_step(empty, tokens, seqs, self.pad_slot, self.block_size),
                                      *shape, self.pad_slot)  # fmt: skip
            self._prefill_forward(tokens, seqs)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._prefill_forward(tokens, seqs)
            self.prefill_graphs[(tokens, seqs)] = (graph, out)
        torch.cuda.synchronize(self.device)

    def _prefill_forward(self, tokens: int, seqs: int) -> Tensor:
        """Logits of the step's logit rows, or their hidden states where not `head_in_graph` (`run` applies
        the head after the replay)."""
        views = self.prefill_buffers.views(tokens, seqs, self.width)
        meta = metadata(views, self.block_size, tokens, seqs, tokens)
        hidden = self.model(views["input_ids"], views["positions"], meta, self.kv_cache)
        rows = hidden.index_select(0, views["logit_rows"][:seqs])
        return self.model.logits(rows) if head_in_graph(seqs) else rows

    def _decode_forward(self, bucket: int) -> Tensor:
        views = self.decode_views
        meta = metadata(views, self.block_size, 1, bucket, bucket)
        hidden = self.model(views["input_ids"][:bucket], views["positions"][:bucket], meta, self.kv_cache)
        return self.model.logits(hidden)

    def accepts_device_input(self, num_seqs: int) -> bool:
        return bucket_for(num_seqs, self.buckets) is not None

    def run(self, batch: list[ScheduledSeq], input_tokens: Tensor | None = None) -> Tensor | None:
        """Logits [rows needing logits, vocab] float32 of the step, or None when no row needs them.
        `input_tokens` (device int64, one per sequence) overrides a decode step's input ids on the device."""
        step = host_step(batch, self.block_size)
        bucket = bucket_for(len(batch), self.buckets) if step.is_decode else None
        if input_tokens is not None and bucket is None:
            raise ValueError("device input tokens are for decode steps of a graph bucket")
        if bucket is None:
            rows = len(step.logit_rows)
            shape = prefill_bucket(len(step.input_ids), len(step.context_lens), rows, self.prefill_sizes)
            if shape is None or shape not in self.prefill_graphs:
                return self._run_eager(step)
            tokens, seqs = shape
            padded = padded_step(step, tokens, seqs, self.pad_slot, self.block_size)
            # rows past the step's sequences and the padding one are empty (no keys): their tables go unread
            self.prefill_buffers.fill(padded, tokens, seqs, self.width, self.pad_slot, len(step.tables) + 1)
            graph, out = self.prefill_graphs[shape]
            graph.replay()
            if not rows:
                return None
            return out[:rows].clone() if head_in_graph(seqs) else self.model.logits(out[:rows])
        self.decode_buffers.fill(step, *self.decode_shape, self.pad_slot, bucket)
        if input_tokens is not None:  # queued after the input copy: the ids the last step sampled
            self.decode_views["input_ids"][: len(batch)].copy_(input_tokens)
        if bucket not in self.graphs:
            return self._decode_forward(bucket)[: len(batch)]
        graph, logits = self.graphs[bucket]
        graph.replay()
        return logits[: len(batch)].clone()  # the graph's output buffer is overwritten by the next replay

    def _run_eager(self, step: HostStep) -> Tensor | None:
        shape = (len(step.input_ids), len(step.context_lens), max(map(len, step.tables)))
        self.eager_buffers.fill(step, *shape, self.pad_slot)
        views = self.eager_buffers.views(*shape)
        meta = metadata(views, self.block_size, step.max_q, shape[1], shape[0])
        hidden = self.model(views["input_ids"], views["positions"], meta, self.kv_cache)
        if not step.logit_rows:
            return None
        return self.model.logits(hidden.index_select(0, views["logit_rows"][: len(step.logit_rows)]))
