"""Turn logits into next tokens, per request and batched.

Order of processing (as in vLLM): logit bias, repetition / presence / frequency penalties, temperature, top-k,
top-p, min-p. Greedy rows (temperature 0) take the argmax of the penalized logits. Seeded requests draw
their noise from a generator seeded with (seed, position), so the same seed gives the same tokens
whatever else shares the batch. Logprobs are those of the model's raw distribution (log-softmax of the
logits before any processing), as vLLM and the OpenAI API report them.
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor

from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.sequence import Sequence

_SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, position) over the seed space
_CANDIDATES = 256  # tokens examined for top-p before falling back to a full sort of a row


@dataclass
class TokenLogprobs:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]  # None where the request did not ask for logprobs


def penalize(
    logits: Tensor, params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]]
) -> Tensor:
    """The logit bias, then the repetition penalty over prompt + output tokens (HF semantics) and presence /
    frequency over outputs (OpenAI).

    Batched and sparse: only the logits of biased tokens and of tokens that occurred are read and written.
    """
    if not any(_has_penalty(p) for p in params):
        return logits
    logits = logits.clone()
    flat, vocab = logits.view(-1), logits.shape[-1]
    if any(p.logit_bias for p in params):
        index, bias = bias_index([p.logit_bias for p in params], vocab)
        flat.index_add_(0, index.to(logits.device), bias.to(logits.device, logits.dtype))
    if held := held_back(params, outputs, vocab):
        flat[torch.tensor(held, device=logits.device)] = float("-inf")
    if any(p.repetition_penalty != 1.0 for p in params):
        contexts = [prompt + output for prompt, output in zip(prompts, outputs, strict=True)]
        seen = _flat_index(contexts, vocab, logits.device).unique()
        penalty = _per_row([p.repetition_penalty for p in params], logits)[seen // vocab]
        values = flat[seen]
        flat[seen] = torch.where(values > 0, values / penalty, values * penalty)
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        occurred, counts = _flat_index(outputs, vocab, logits.device).unique(return_counts=True)
        rows = occurred // vocab
        frequency = _per_row([p.frequency_penalty for p in params], logits)[rows]
        presence = _per_row([p.presence_penalty for p in params], logits)[rows]
        flat[occurred] -= frequency * counts + presence
    return logits


def _flat_index(token_lists: list[list[int]], vocab: int, device: torch.device) -> Tensor:
    """row * vocab + token for every token of every row (indexes the flattened [N, vocab] logits)."""
    parts = [torch.tensor(tokens, dtype=torch.long) + row * vocab for row, tokens in enumerate(token_lists)]
    return torch.cat(parts).to(device) if parts else torch.empty(0, dtype=torch.long, device=device)


def _per_row(values: list[float], like: Tensor) -> Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def _has_penalty(params: SamplingParams) -> bool:
    penalties = params.repetition_penalty != 1.0 or bool(params.presence_penalty or params.frequency_penalty)
    return penalties or bool(params.logit_bias) or params.min_tokens > 0


def held_back(params: list[SamplingParams], outputs: list[list[int]], vocab: int) -> list[int]:
    """Flat indexes of the EOS and stop tokens of rows still short of their min_tokens (vLLM's min_tokens)."""
    return [
        row * vocab + token
        for row, (p, output) in enumerate(zip(params, outputs, strict=True))
        if len(output) < p.min_tokens
        for token in {*p.eos_token_ids, *p.stop_token_ids}
    ]


def bias_index(biases: list[dict[int, float]], vocab: int) -> tuple[Tensor, Tensor]:
    """Each row's logit bias as (row * vocab + token, bias) over the flattened [N, vocab] logits."""
    pairs = [(row * vocab + token, value) for row, bias in enumerate(biases) for token, value in bias.items()]
    index = torch.tensor([i for i, _ in pairs], dtype=torch.long)
    return index, torch.tensor([v for _, v in pairs], dtype=torch.float32)


def truncate(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Temperature, then top-k, top-p and min-p as -inf masks; rows are independent."""
    if any(p.temperature != 1.0 for p in params):
        temperatures = [p.temperature if p.temperature > 0 else 1.0 for p in params]
        logits = logits / torch.tensor(temperatures, device=logits.device)[:, None]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        logits = _top_k_top_p(logits, params)
    if any(p.min_p > 0.0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=logits.device)
        probs = torch.softmax(logits, dim=-1)
        too_unlikely = probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(too_unlikely, float("-inf"))
    return logits


def _top_k_top_p(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Apply top-k/top-p to the rows that ask for it; the other rows stay untouched."""
    vocab = logits.shape[-1]
    rows = [row for row, p in enumerate(params) if 0 < p.top_k < vocab or p.top_p < 1.0]
    if not rows:  # top-k at or past the vocabulary is no truncation (as in vLLM)
        return logits
    if len(rows) == len(params):
        return _truncate_rows(logits, params)
    index = torch.tensor(rows, device=logits.device)
    result = logits.clone()
    result[index] = _truncate_rows(logits[index], [params[row] for row in rows])
    return result


def _truncate_rows(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Mask all but each row's top-k, then all but the smallest set of the rest holding top-p of the mass.

    Works on the best `_CANDIDATES` tokens (a partial top-k instead of sorting the whole vocabulary); rows
    whose nucleus reaches past them are redone over the full sorted row, so the result is exact.
    """
    vocab = logits.shape[-1]
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=logits.device)
    top_p = torch.tensor([p.top_p for p in params], device=logits.device)
    wanted = max((p.top_k for p in params if 0 < p.top_k < vocab), default=0)
    candidates = min(vocab, max(wanted, _CANDIDATES if any(p.top_p < 1.0 for p in params) else 0))
    values, order = logits.topk(candidates, dim=-1)
    drop, complete = _nucleus_drop(values, logits, top_k, top_p)
    if not bool(complete.all()):
        incomplete = (~complete).nonzero().flatten()
        full_values, full_order = logits[incomplete].sort(dim=-1, descending=True)
        full_drop, _ = _nucleus_drop(full_values, logits[incomplete], top_k[incomplete], top_p[incomplete])
        redone = torch.full_like(logits[incomplete], float("-inf"))
        redone.scatter_(-1, full_order, full_values.masked_fill(full_drop, float("-inf")))
    masked = torch.full_like(logits, float("-inf")).scatter_(
        -1, order, values.masked_fill(drop, float("-inf"))
    )
    if not bool(complete.all()):
        masked[incomplete] = redone
    return masked


def _nucleus_drop(values: Tensor, logits: Tensor, top_k: Tensor, top_p: Tensor) -> tuple[Tensor, Tensor]:
    """Which of the descending `values` to drop, and per row whether `values` held the whole decision."""
    ranks = torch.arange(values.shape[-1], device=values.device)
    drop = ranks[None, :] >= top_k[:, None]
    kept_all_of_k = top_k <= values.shape[-1]
    normalizer = torch.logsumexp(values.masked_fill(drop, float("-inf")), dim=-1)
    if not bool(kept_all_of_k.all()):  # rows without top-k normalize over the whole vocabulary
        normalizer = torch.where(kept_all_of_k, normalizer, torch.logsumexp(logits, dim=-1))
    probs = torch.exp(values - normalizer[:, None]).masked_fill(drop, 0.0)
    cumulative = probs.cumsum(dim=-1)
    drop |= (cumulative - probs) >= top_p[:, None]  # the most likely token always stays
    complete = kept_all_of_k | (cumulative[:, -1] >= top_p) | (values.shape[-1] == logits.shape[-1])
    return drop, complete


def probabilities(
    logits: Tensor, params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]]
) -> Tensor:
    """The final next-token distributions [N, vocab] (one-hot for greedy rows): what gets sampled from.

    Speculative rejection sampling needs exactly these.
    """
    if any(
        p.constraint is not None for p in params
    ):  # grammar-constrained rows (backends/local_engine/engine/structured.py)
        from backends.local_engine.engine.structured import constrain  # llguidance loads only when used

        logits = constrain(logits.float(), [p.constraint for p in params], outputs)
    processed = penalize(logits.float(), params, prompts, outputs)
    greedy = [row for row, p in enumerate(params) if p.greedy]
    sampled = [row for row, p in enumerate(params) if not p.greedy]
    if not greedy:
        return torch.softmax(truncate(processed, params), dim=-1)
    probs = torch.zeros_like(processed)
    rows = torch.tensor(greedy, device=logits.device)
    probs[rows, processed[rows].argmax(dim=-1)] = 1.0
    if sampled:
        rows = torch.tensor(sampled, device=logits.device)
        probs[rows] = torch.softmax(truncate(processed[rows], [params[i] for i in sampled]), dim=-1)
    return probs


def probs_for(logits: Tensor, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]) -> Tensor:
    """One row's distribution (the per-row form of `probabilities`)."""
    return probabilities(logits.unsqueeze(0), [params], [prompt_ids], [output_ids])[0]


def seeded_generator(seed: int, position: int, device: torch.device) -> torch.Generator:
    mixed = (seed * _SEED_MIX + position) % (2**63)
    return torch.Generator(device=device).manual_seed(mixed)


class Sampler:
    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator  # for requests without a seed (None = torch's default RNG)

    def sample(self, logits: Tensor, seqs: list[Sequence]) -> SamplerOutput:
        """One next token per row of `logits` [N, vocab]; row i belongs to seqs[i]."""
        params = [s.params for s in seqs]
        prompts = [s.token_ids[: s.num_prompt_tokens] for s in seqs]
        outputs = [s.token_ids[s.num_prompt_tokens :] for s in seqs]
        probs = probabilities(logits, params, prompts, outputs)
        # greedy rows are one-hot: one batched argmax instead of one op (and sync) per row
        argmax = probs.argmax(dim=-1).tolist() if any(p.greedy for p in params) else []
        token_ids = [
            argmax[row] if seq.params.greedy else self._draw(probs[row], seq) for row, seq in enumerate(seqs)
        ]
        return SamplerOutput(token_ids, _logprobs(logits, token_ids, params))

    def _draw(self, probs: Tensor, seq: Sequence) -> int:
        """Exponential race: argmax(p / E) with E ~ Exp(1) samples from p and is one op per row."""
        seed = seq.params.seed
        generator = self.generator if seed is None else seeded_generator(seed, len(seq), probs.device)
        noise = torch.empty_like(probs).exponential_(generator=generator)
        return int((probs / noise).argmax())


def _logprobs(
    logits: Tensor, token_ids: list[int], params: list[SamplingParams]
) -> list[TokenLogprobs | None]:
    rows = [row for row, p in enumerate(params) if p.logprobs]
    result: list[TokenLogprobs | None] = [None] * len(params)
    if not rows:
        return result
    logprobs = torch.log_softmax(logits[rows].float(), dim=-1)
    for row, values in zip(rows, logprobs, strict=True):
        result[row] = TokenLogprobs(token_ids[row], float(values[token_ids[row]]), _top(values, params[row]))
    return result


def _top(logprobs: Tensor, params: SamplingParams) -> list[tuple[int, float]]:
    if not params.top_logprobs:
        return []
    values, ids = logprobs.topk(params.top_logprobs)
    return list(zip(ids.tolist(), values.tolist(), strict=True))
