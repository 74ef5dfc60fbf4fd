"""N-gram (prompt lookup) speculative decoding: propose tokens from earlier context, verify in one pass.

Proposals are deterministic, so the draft distribution is a point mass q(d) = 1 and rejection sampling
reduces to: accept draft d with probability p(d); on the first rejection sample from p with d removed
(the normalised residual max(0, p - q)); if every draft is accepted, sample a bonus token from the last
position. The emitted tokens then follow exactly the target distribution p. Greedy requests accept a
draft only when it is the argmax, so their output is identical to plain decoding.
"""

from dataclasses import dataclass

import torch


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, ngram_min: int, ngram_max: int) -> None:
        self.k = num_speculative_tokens
        self.ngram_min = max(1, ngram_min)
        self.ngram_max = max(self.ngram_min, ngram_max)

    def propose(self, token_ids: list[int], limit: int | None = None) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
        k = self.k if limit is None else min(self.k, limit)
        if k <= 0:
            return []
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            start = _latest_earlier_match(token_ids, n)
            if start is not None:
                return token_ids[start + n : start + n + k]
        return []


@dataclass
class AcceptanceGate:
    """Per sequence: stop proposing while drafts are mostly rejected (they cost a verification row each).

    An exponential moving average of each round's acceptance rate; once it falls below `min_acceptance`
    (after `warmup` rounds), proposals pause for `backoff` generated tokens, then one round probes again.
    """

    min_acceptance: float
    warmup: int = 2
    backoff: int = 16
    decay: float = 0.5
    rate: float = 1.0
    rounds: int = 0
    paused_until: int = 0  # number of output tokens before which nothing is proposed

    def allows(self, num_output_tokens: int) -> bool:
        return num_output_tokens >= self.paused_until

    def record(self, num_drafts: int, num_accepted: int, num_output_tokens: int) -> None:
        if not num_drafts:
            return
        self.rounds += 1
        self.rate = self.decay * self.rate + (1 - self.decay) * num_accepted / num_drafts
        if self.rounds >= self.warmup and self.rate < self.min_acceptance:
            self.paused_until = num_output_tokens + self.backoff
            self.rate = self.min_acceptance  # one good probe round re-enables, one bad one pauses again


def _latest_earlier_match(token_ids: list[int], n: int) -> int | None:
    """Start of the rightmost earlier occurrence of the last n tokens (followed by at least one token)."""
    length = len(token_ids)
    if length <= n:
        return None
    suffix = token_ids[-n:]
    last = suffix[-1]
    for end in range(length - 2, n - 2, -1):
        if token_ids[end] == last and token_ids[end - n + 1 : end + 1] == suffix:
            return end - n + 1
    return None


def verify_greedy(drafts: list[int], probs: torch.Tensor) -> list[int]:
    """Accepted drafts followed by one token of our own. probs: [len(drafts) + 1, vocab]."""
    targets = probs.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return drafts[:accepted] + [targets[accepted]]


def verify_sampled(drafts: list[int], probs: torch.Tensor, generator: torch.Generator | None) -> list[int]:
    """Rejection sampling against point-mass drafts; the output follows `probs` exactly."""
    uniforms = torch.rand(len(drafts), generator=generator, device=probs.device).tolist()
    for index, draft in enumerate(drafts):
        if uniforms[index] < probs[index, draft].item():
            continue
        residual = probs[index].clone()
        residual[draft] = 0.0
        if residual.sum() <= 0:  # p(draft) rounded below 1 but nothing else is possible
            return drafts[: index + 1] + [_sample(probs[index + 1], generator)]
        return drafts[:index] + [_sample(residual, generator)]
    return drafts + [_sample(probs[len(drafts)], generator)]


def _sample(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(weights, 1, generator=generator).item())
