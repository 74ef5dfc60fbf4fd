"""Logprobs as the API reports them: of the model's raw distribution (log-softmax of the logits), for the
tokens it produced and, when asked, for the prompt's own tokens."""

import torch

from backends.local_engine.engine.outputs import TokenLogprob


def token_logprob(logits: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if num_top:
        values, ids = logprobs.topk(num_top)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token_id, float(logprobs[token_id]), top)


def prompt_chunk_logprobs(
    logits: torch.Tensor, token_ids: list[int], start: int, num_prompt_tokens: int, num_top: int
) -> list[TokenLogprob]:
    """The logprobs of the prompt tokens that a chunk's rows predict: row r (position start + r) predicts the
    token at start + r + 1, for those still inside the prompt."""
    rows = range(min(len(logits), num_prompt_tokens - 1 - start))
    return [token_logprob(logits[r], token_ids[start + r + 1], num_top) for r in rows]
