"""The engine's Llama model against transformers loading the same GGUF, plus paged-KV invariants."""

import copy

import pytest
import torch

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.model_runner import ModelRunner
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence
from backends.local_engine.model.kv_cache import KVCache, slots_for
from tests.engine_model_support import BumpAllocator, greedy, hf_reference, run_step

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5,",
    "The quick brown fox",
    "Water boils at a temperature of",
    "import numpy as np\nx = np.",
    "Q: What is the largest planet in our solar system?\nA:",
    "Les chats sont",
    "The meaning of life is",
    "SELECT name FROM users WHERE",
    "In 1969, the first humans",
    "Photosynthesis is the process by which",
    "Dear Sir or Madam,\n\nI am writing to",
    "The recipe calls for two cups of",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
    "🙂 Emoji and ünïcödé text:",
    "    indented   whitespace\t\truns",
    "The Pythagorean theorem states that",
    "Shakespeare wrote",
]
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(EngineSettings(dtype="fp32", kv_cache_memory_mb=96, max_model_len=1024))


@pytest.fixture(scope="module")
def reference():
    return hf_reference()


def fresh_alloc(runner: ModelRunner) -> BumpAllocator:
    return BumpAllocator(runner.num_blocks, runner.block_size)


def with_block_size(runner: ModelRunner, block_size: int) -> ModelRunner:
    """The same loaded model over a new KV pool with another block size."""
    other = copy.copy(runner)
    other.block_size = block_size
    other.num_blocks = runner.num_blocks * runner.block_size // block_size
    other.kv_cache = KVCache(runner.config, other.num_blocks, block_size, torch.float32, runner.device)
    return other


def prompt_of_length(runner: ModelRunner, length: int) -> list[int]:
    text = " ".join(PROMPTS) * 8
    return runner.tokenizer.encode(text, add_special_tokens=False)[:length]


@pytest.mark.parametrize("length", [1, 9, 57, 300])
def test_logits_match_transformers(runner, reference, length):
    ids = prompt_of_length(runner, length)
    (ours,) = run_step(runner, fresh_alloc(runner), [(Sequence(list(ids)), length)], num_logits=length)
    with torch.no_grad():
        theirs = reference[0](torch.tensor([ids])).logits[0]
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < 2e-3


def test_greedy_continuations_match_transformers_generate(runner, reference):
    model, _ = reference
    prompts = [runner.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    ours = greedy(runner, prompts, NEW_TOKENS, fresh_alloc(runner))
    for prompt, continuation in zip(prompts, ours, strict=True):
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True
            )
        assert continuation == out[0, len(prompt) :].tolist(), prompt


def test_alone_equals_batched_and_block_size_does_not_matter(runner):
    prompts = [runner.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[:5]]
    alone = greedy(runner, prompts[:1], NEW_TOKENS, fresh_alloc(runner))[0]
    batched = greedy(runner, prompts, NEW_TOKENS, fresh_alloc(runner))
    assert batched[0] == alone
    big_blocks = with_block_size(runner, 32)
    assert greedy(big_blocks, prompts, NEW_TOKENS, fresh_alloc(big_blocks)) == batched


def test_batched_logits_equal_alone_logits_for_mixed_prefill_and_decode(runner):
    ids = prompt_of_length(runner, 40)
    alloc = fresh_alloc(runner)
    (alone,) = run_step(runner, alloc, [(Sequence(list(ids)), 40)])
    decoding = Sequence(prompt_of_length(runner, 25))
    run_step(runner, alloc, [(decoding, 24)])  # leaves one token for a decode step
    mid_prefill = Sequence(prompt_of_length(runner, 90))
    run_step(runner, alloc, [(mid_prefill, 30)])
    target = Sequence(list(ids))
    logits = run_step(runner, alloc, [(decoding, 1), (target, 40), (mid_prefill, 20)])
    assert logits[2] is None  # a chunk that does not reach the end of the prompt gets no logits
    assert torch.allclose(logits[1], alone, atol=1e-4)


@pytest.mark.parametrize("layout", ["per_seq", "padded"])
def test_attention_layouts_agree(runner, layout):
    forced = copy.copy(runner)
    forced.attention_layout = layout
    prompts = [prompt_of_length(runner, n) for n in (3, 17, 33)]
    assert greedy(forced, prompts, 4, fresh_alloc(runner)) == greedy(runner, prompts, 4, fresh_alloc(runner))


@pytest.mark.parametrize("block_size", [16, 32])
def test_chunked_prefill_writes_the_same_kv_as_one_shot(runner, block_size):
    paged = with_block_size(runner, block_size)
    ids = prompt_of_length(runner, 70)
    one_shot, chunked = Sequence(list(ids)), Sequence(list(ids))
    alloc = fresh_alloc(paged)
    (full_logits,) = run_step(paged, alloc, [(one_shot, 70)])
    for size in (5, 27, 38):  # chunk boundaries fall inside blocks
        (last,) = run_step(paged, alloc, [(chunked, size)])
    assert torch.allclose(last, full_logits, atol=1e-4)
    assert set(one_shot.block_table).isdisjoint(chunked.block_table)
    pool = paged.kv_cache.pool
    for seq_a, seq_b in [(one_shot, chunked)]:
        slots_a = slots_for(torch.tensor(seq_a.block_table), 0, 70, block_size)
        slots_b = slots_for(torch.tensor(seq_b.block_table), 0, 70, block_size)
        assert torch.allclose(pool[:, :, slots_a], pool[:, :, slots_b], atol=1e-4)
        assert pool[:, :, slots_a].abs().sum() > 0


def test_execute_rejects_a_block_table_too_short(runner):
    seq = Sequence(prompt_of_length(runner, 40), block_table=[0])
    with pytest.raises(ValueError, match="block table"):
        runner.execute([ScheduledSeq(seq, 40)])


def test_runner_reports_sizes(runner):
    config = runner.config
    assert runner.kv_bytes_per_token == 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    assert runner.num_blocks == 96 * 1024 * 1024 // (runner.block_size * runner.kv_bytes_per_token)
    assert 400e6 < runner.weight_bytes < 700e6  # ~135M float32 parameters, tied embeddings counted once
    assert runner.eos_token_ids == (2,)
