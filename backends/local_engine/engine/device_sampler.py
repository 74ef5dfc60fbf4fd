"""Batched sampling on the logits' device with one host sync per step (the CUDA engine's sampler).

The same processing as sampler.py, in the same order (penalties, temperature, top-k, top-p, min-p), as
whole-batch tensor ops with no data-dependent shapes: penalty counts are scattered into a [N, vocab]
tensor, top-k/top-p sort whole rows. Sampling is the exponential race argmax(p / E): E comes from a
counter-based hash of (row key, token id), where a seeded request's key mixes its seed with the position,
so its tokens do not depend on what else shares the batch; unseeded rows draw a fresh key per step.
Greedy rows take the argmax of the penalized logits. The only sync is reading the token ids back.
"""

import random

import torch
from torch import Tensor

from backends.local_engine.engine.sampler import _SEED_MIX, _has_penalty, bias_index, held_back
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.sequence import Sequence

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """An unsigned 64-bit constant as the int64 torch stores (wrapping arithmetic keeps the bits)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _MIX1, _MIX2 = _signed(_SEED_MIX), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shift_right(x: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def exponential_noise(keys: Tensor, vocab: int) -> Tensor:
    """E ~ Exp(1) per (row, token) [N, vocab] float32 from splitmix64 of key + token * golden ratio."""
    tokens = torch.arange(vocab, device=keys.device, dtype=torch.int64)
    x = keys[:, None] + tokens[None, :] * _GOLDEN
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    x = x ^ _shift_right(x, 31)
    uniform = (_shift_right(x, 40).float() + 0.5) * (1.0 / (1 << 24))  # in (0, 1), 24 bits
    return -torch.log(uniform)


def row_key(params: SamplingParams, position: int, rng: random.Random) -> int:
    """A seeded request's key depends on (seed, position) only; others get a fresh random key."""
    if params.seed is None:
        return _signed(rng.getrandbits(64))
    return _signed(params.seed * _SEED_MIX + position)


def penalize_dense(
    logits: Tensor, params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]]
) -> Tensor:
    """sampler.penalize as dense [N, vocab] ops: occurrence counts scattered with index_put_ (no sync)."""
    n, vocab = logits.shape
    device = logits.device

    def counts(token_lists: list[list[int]]) -> Tensor:
        flat = [token + row * vocab for row, tokens in enumerate(token_lists) for token in tokens]
        result = torch.zeros(n * vocab, device=device, dtype=torch.float32)
        if flat:
            index = torch.tensor(flat, dtype=torch.int64).to(device, non_blocking=True)
            result.index_put_((index,), torch.ones_like(index, dtype=torch.float32), accumulate=True)
        return result.view(n, vocab)

    if any(p.logit_bias for p in params):
        index, bias = bias_index([p.logit_bias for p in params], vocab)
        index, bias = index.to(device, non_blocking=True), bias.to(device=device, dtype=logits.dtype)
        logits = logits.reshape(-1).index_add(0, index, bias).view(n, vocab)
    if held := held_back(params, outputs, vocab):
        index = torch.tensor(held, dtype=torch.int64).to(device, non_blocking=True)
        logits = logits.reshape(-1).index_fill(0, index, float("-inf")).view(n, vocab)
    values = torch.tensor(
        [[p.repetition_penalty, p.frequency_penalty, p.presence_penalty] for p in params], device=device
    )
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = counts([prompt + output for prompt, output in zip(prompts, outputs, strict=True)]) > 0
        penalty = values[:, 0:1]
        penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, penalized, logits)
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        occurred = counts(outputs)
        logits = logits - occurred * values[:, 1:2] - (occurred > 0) * values[:, 2:3]
    return logits


def truncate_dense(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Temperature, top-k, top-p and min-p over whole rows (full sort when top-k/top-p is asked)."""
    device, vocab = logits.device, logits.shape[-1]
    rows = torch.tensor(
        [
            [p.temperature if p.temperature > 0 else 1.0, p.top_k if 0 < p.top_k < vocab else vocab, p.top_p,
             p.min_p]
            for p in params
        ],
        device=device,
    )  # fmt: skip
    logits = logits / rows[:, 0:1]
    if any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params):
        values, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device)[None, :]
        drop = ranks >= rows[:, 1:2]
        probs = torch.softmax(values.masked_fill(drop, float("-inf")), dim=-1)
        cumulative = probs.cumsum(dim=-1)
        drop |= (cumulative - probs) >= rows[:, 2:3]  # the most likely token always stays
        logits = torch.full_like(logits, float("-inf")).scatter_(
            -1, order, values.masked_fill(drop, float("-inf"))
        )
    if any(p.min_p > 0.0 for p in params):
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < rows[:, 3:4] * probs.amax(dim=-1, keepdim=True), float("-inf"))
    return logits


def argmax_rows(logits: Tensor) -> Tensor:
    """logits.argmax(-1) in two passes over chunks of the vocabulary: torch's one-pass argmax of a few
    long rows runs one block per row (27 us for one 128k-token row on the H200, studies/README.md). The
    first maximum wins, as in argmax."""
    rows, vocab = logits.shape
    chunk = next((c for c in (1024, 512, 256, 128) if vocab % c == 0 and vocab > 4 * c), 0)
    if rows > 16 or not chunk:
        return logits.argmax(dim=-1)
    values, inner = logits.view(rows, vocab // chunk, chunk).max(dim=-1)
    best = values.argmax(dim=-1, keepdim=True)
    return (best * chunk + inner.gather(1, best)).squeeze(1)


class DeviceSampler:
    """Next tokens for a batch of sequences, computed where the logits are; one `.tolist()` per call
    (`sample`), or none (`sample_async`, whose tokens the next decode step reads on the device)."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = random.Random(seed)

    def sample(self, logits: Tensor, seqs: list[Sequence]) -> list[int]:
        return self.sample_async(logits, seqs).tolist()

    def sample_async(self, logits: Tensor, seqs: list[Sequence]) -> Tensor:
        """The next tokens as an int64 tensor on the logits' device, without waiting for them."""
        params = [s.params for s in seqs]
        logits = logits.float()
        if any(_has_penalty(p) for p in params):
            prompts = [s.token_ids[: s.num_prompt_tokens] for s in seqs]
            outputs = [s.token_ids[s.num_prompt_tokens :] for s in seqs]
            logits = penalize_dense(logits, params, prompts, outputs)
        greedy_tokens = argmax_rows(logits)
        if all(p.greedy for p in params):
            return greedy_tokens
        probs = torch.softmax(truncate_dense(logits, params), dim=-1)
        keys = [row_key(p, len(s), self.rng) for p, s in zip(params, seqs, strict=True)]
        key_tensor = torch.tensor(keys, dtype=torch.int64).to(logits.device, non_blocking=True)
        sampled = (probs / exponential_noise(key_tensor, logits.shape[-1])).argmax(dim=-1)
        greedy = torch.tensor([p.greedy for p in params]).to(logits.device, non_blocking=True)
        return torch.where(greedy, greedy_tokens, sampled)
