"""Test helpers for the engine model: a trivial block allocator and greedy loops over ModelRunner."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from backends.local_engine.engine.model_runner import ModelRunner  # noqa: E402
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence  # noqa: E402
from backends.local_engine.loading.gguf import packaged_model_path  # noqa: E402


class BumpAllocator:
    """Hands out fresh blocks in order, never reusing them (enough for a test's few sequences)."""

    def __init__(self, num_blocks: int, block_size: int, first_block: int = 0) -> None:
        self.next_block, self.num_blocks, self.block_size = first_block, num_blocks, block_size

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        while len(seq.block_table) * self.block_size < num_tokens:
            if self.next_block >= self.num_blocks:
                raise RuntimeError("test allocator out of blocks")
            seq.block_table.append(self.next_block)
            self.next_block += 1


def run_step(
    runner: ModelRunner, alloc: BumpAllocator, chunks: list[tuple[Sequence, int]], num_logits: int = 1
):
    """Compute the given chunks in one forward pass and advance the sequences; returns the logits list."""
    for seq, n in chunks:
        alloc.grow(seq, seq.num_computed_tokens + n)
    outputs = runner.execute([ScheduledSeq(seq, n, min(num_logits, n)) for seq, n in chunks])
    for seq, n in chunks:
        seq.num_computed_tokens += n
    return [out.logits for out in outputs]


def greedy(
    runner: ModelRunner, prompts: list[list[int]], max_new_tokens: int, alloc: BumpAllocator
) -> list[list[int]]:
    """Batched greedy decoding: one prefill step for all prompts, then one decode step per token."""
    seqs = [Sequence(list(p)) for p in prompts]
    pending = [(seq, len(seq.token_ids)) for seq in seqs]
    for _ in range(max_new_tokens):
        logits = run_step(runner, alloc, pending)
        for seq, row in zip(seqs, logits, strict=True):
            seq.append_token(int(row[-1].argmax()))
        pending = [(seq, 1) for seq in seqs]
    return [seq.output_ids for seq in seqs]


def reference_model_dir() -> tuple[str, str]:
    path = packaged_model_path()
    return str(path.parent), path.name


def hf_reference():
    """transformers' model and tokenizer loaded from the same GGUF (dequantized to fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = reference_model_dir()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder, gguf_file=name)
