"""Numerics for bench/engine_gpu.py: our logits against an fp32 HF reference (teacher forced, and decode step by
step), top-1 agreement, the float64 floor, and the fair HF bf16 baseline.

HF bf16 is built from the fp32 reference by `hf_to_bf16`: `model.to(torch.bfloat16)` alone also rounds the RoPE
`inv_freq` buffers to bf16, so HF bf16 positions drift from fp32 as they grow (issue 45: argmax agreement with
fp32 0.32 at positions 1,024-1,535 on 1B); the fair baseline keeps `inv_freq` in fp32, as a bf16 checkpoint
loaded by transformers does (the buffer is computed at init, not stored). Both are measured.
"""

import torch

from backends.local_engine.engine.sequence import ScheduledSeq, Sequence
from bench.lib.engine_gpu_models import Ours, hf_logits, hf_static, random_prompts


def hf_to_bf16(hf, keep_rope_fp32: bool = True):
    """`hf` (fp32) converted in place to bf16; with `keep_rope_fp32` its inv_freq buffers stay fp32."""
    saved = {name: buf.clone() for name, buf in hf.named_buffers() if name.endswith("inv_freq")}
    hf.to(torch.bfloat16)
    if keep_rope_fp32:
        set_rope_buffers(hf, saved)
    return hf


def set_rope_buffers(hf, saved: dict[str, torch.Tensor]) -> None:
    modules = dict(hf.named_modules())
    for name, value in saved.items():
        owner, _, attr = name.rpartition(".")
        setattr(modules[owner], attr, value.clone())


def rope_buffers(hf) -> dict[str, torch.Tensor]:
    return {name: buf.clone() for name, buf in hf.named_buffers() if name.endswith("inv_freq")}


def long_reference(hf, vocab: int, count: int = 2, prompt: int = 1024, tail: int = 512) -> list[list[int]]:
    """`count` sequences of `prompt` random tokens and `tail` greedy fp32 HF tokens after them."""
    prompts = random_prompts(count, prompt, prompt, vocab, 13)
    return [p + out for p, out in zip(prompts, hf_static(hf, prompts, count, tail), strict=True)]


def teacher_forced_logits(ours: Ours, ids: list[int], first: int) -> torch.Tensor:
    """Logits of positions first-1 .. len-2 (predicting ids[first:]) in one prefill step."""
    runner = ours.runner
    seq = Sequence(list(ids))
    seq.block_table = list(range(-(-len(ids) // runner.block_size)))
    out = runner.execute([ScheduledSeq(seq, len(ids), len(ids) - first + 1)])[0].logits
    return out[:-1].float()


def decode_logits(ours: Ours, ids: list[int], first: int, graphs: bool = True) -> torch.Tensor:
    """Logits predicting ids[first:], computed by a prefill of ids[:first] then one decode step per token
    (replaying the CUDA graph, or eagerly with `graphs` False)."""
    runner = ours.runner
    saved = runner.cuda_steps.graphs
    if not graphs:
        runner.cuda_steps.graphs = {}
    try:
        seq = Sequence(list(ids[:first]))
        seq.block_table = list(range(-(-len(ids) // runner.block_size)))
        rows = [runner.execute([ScheduledSeq(seq, first, 1)])[0].logits[-1].clone()]
        seq.num_computed_tokens = first
        for token in ids[first:-1]:
            seq.append_token(token)
            rows.append(runner.execute([ScheduledSeq(seq, 1, 1)])[0].logits[-1].clone())  # graph output: copy
            seq.num_computed_tokens += 1
        return torch.stack(rows).float()
    finally:
        runner.cuda_steps.graphs = saved


def agreement(ours: Ours, reference: list[list[int]], ref_logits: list[torch.Tensor], tail: int = 32) -> dict:
    rows = [teacher_forced_logits(ours, ids, len(ids) - tail) for ids in reference]
    return agreement_of(rows, reference, ref_logits, tail)


def agreement_of(
    rows: list[torch.Tensor], reference: list[list[int]], ref_logits: list[torch.Tensor], tail: int = 32
) -> dict:
    """Top-1 agreement with the fp32 reference's greedy tokens (the last `tail` of each) and the largest
    logit difference."""
    hits = sum(
        int((r.argmax(-1).cpu() == torch.tensor(ids[-tail:])).sum())
        for r, ids in zip(rows, reference, strict=True)
    )
    diff = max(float((r.float() - ref).abs().max()) for r, ref in zip(rows, ref_logits, strict=True))
    return {"top1_agreement": hits / (tail * len(reference)), "max_logit_diff": diff}


def hf_agreement(hf, reference: list[list[int]], ref_logits: list[torch.Tensor], tail: int) -> dict:
    rows = [hf_logits(hf, ids)[len(ids) - tail - 1 : -1] for ids in reference]
    return agreement_of(rows, reference, ref_logits, tail)


def float64_floor(
    hf, reference: list[list[int]], ref_logits: list[torch.Tensor], ours_rows: list[torch.Tensor]
) -> list[float]:
    """How far HF's own fp32 logits are from the same model in float64 (the rounding floor of fp32 at this
    depth), beside ours; hf goes back to fp32 after (fp32 → fp64 → fp32 is exact)."""
    hf.double()
    try:
        exact = [hf_logits(hf, ids, torch.float64)[len(ids) - 33 : -1] for ids in reference]
        return [
            max(float((r.double() - e).abs().max()) for r, e in zip(rows, exact, strict=True))
            for rows in (ref_logits, ours_rows)
        ]
    finally:
        hf.float()
