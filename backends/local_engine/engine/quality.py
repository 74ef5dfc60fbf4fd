"""Teacher-forced evaluation of a ModelRunner on a text: per-position logits, perplexity, argmax agreement.

Used by the quantization tests and bench/engine_model.py to compare weight formats on the same tokens.
"""

import math

import torch
from torch import Tensor

from backends.local_engine.engine.model_runner import ModelRunner
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence


def teacher_forced_logits(runner: ModelRunner, token_ids: list[int], chunk: int = 256) -> Tensor:
    """Logits [len(token_ids), vocab] of every position, prefilled in chunks into blocks 0, 1, ..."""
    if len(token_ids) > runner.num_blocks * runner.block_size:
        raise ValueError("text longer than the KV pool")
    seq = Sequence(list(token_ids), block_table=list(range(-(-len(token_ids) // runner.block_size))))
    rows = []
    for start in range(0, len(token_ids), chunk):
        size = min(chunk, len(token_ids) - start)
        seq.token_ids = list(token_ids[: start + size])  # the chunk reaches the end: logits for all its rows
        seq.num_computed_tokens = start
        (output,) = runner.execute([ScheduledSeq(seq, size, num_logits=size)])
        rows.append(output.logits)
    return torch.cat(rows)


def perplexity(logits: Tensor, token_ids: list[int]) -> float:
    targets = torch.tensor(token_ids[1:])
    nll = torch.nn.functional.cross_entropy(logits[:-1].float(), targets)
    return math.exp(nll.item())


def argmax_agreement(logits: Tensor, reference_logits: Tensor) -> float:
    """Fraction of positions where both pick the same greedy next token."""
    return (logits.argmax(-1) == reference_logits.argmax(-1)).float().mean().item()
