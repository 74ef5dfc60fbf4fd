"""Gemma 3 270M (Q4_K_M GGUF) in the engine against transformers on the same file.

The reference (tests/data/gemma3_reference.json) holds token ids and top-5 logits computed once by
tests/data/make_gemma3_reference.py. The long prompt (> the 512-token sliding window) is run through the
paged KV cache in prefill chunks and then token by token, so both attention layouts meet the window.
"""

import json
from pathlib import Path

import pytest
import torch

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.model_runner import ModelRunner
from backends.local_engine.model.attention import build_metadata
from backends.local_engine.model.gemma3.window import band, windowed
from bench.lib.gemma3_check import chunking, compare, run_chunks

REFERENCE = json.loads((Path(__file__).parent / "data" / "gemma3_reference.json").read_text())
MAX_LOGIT_DIFF = 0.05  # fp32 on both sides, same dequantized weights; measured in the report


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    settings = EngineSettings(model=Path("gemma3-270m"), dtype="fp32", block_size=16, kv_cache_memory_mb=64,
                              max_model_len=2048, num_threads=2)  # fmt: skip
    return ModelRunner(settings)


def _check(logits: torch.Tensor, case: dict) -> float:
    """Argmax must match the reference everywhere; returns the largest difference on its top-5 logits."""
    result = compare(logits, case)
    assert result["argmax_agreement"] == 1.0
    return result["max_top5_logit_diff"]


def test_tokenizer_matches_transformers(runner: ModelRunner) -> None:
    for case in REFERENCE["cases"].values():
        assert runner.tokenizer.encode(case["text"]) == case["ids"]
    for text, ids in REFERENCE["tokenizer"].items():
        assert runner.tokenizer.encode(text, add_special_tokens=False) == ids
        assert runner.tokenizer.decode(ids) == text
    assert runner.tokenizer.encode("<end_of_turn>", add_special_tokens=False) == [106]
    assert 106 in runner.eos_token_ids


@pytest.mark.parametrize("name", ["plain", "chat"])
def test_short_prompts_match_reference(runner: ModelRunner, name: str) -> None:
    case = REFERENCE["cases"][name]
    assert _check(run_chunks(runner, case["ids"], [len(case["ids"])]), case) < MAX_LOGIT_DIFF


@pytest.mark.timeout(900)  # a 1,269-token prompt; about 20 s on an idle 2-core box
def test_long_prompt_through_sliding_window_in_chunks_and_decode(runner: ModelRunner) -> None:
    case = REFERENCE["cases"]["long"]
    assert len(case["ids"]) > 2 * runner.model.config.sliding_window
    chunks = chunking(len(case["ids"]))  # 160-token prefill chunks, then 8 decode steps
    assert chunks[-1] == 1 and max(chunks) == 160
    assert _check(run_chunks(runner, case["ids"], chunks, case["first_position"]), case) < MAX_LOGIT_DIFF


def test_window_metadata_masks_keys_outside_the_window() -> None:
    table, window, cpu = list(range(8)), 5, torch.device("cpu")
    chunk = build_metadata([(table, 10, 4)], 4, cpu, query_group=2)  # queries at positions 10..13
    group = windowed(chunk, window).groups[0]
    assert group.shape == (1, 4, 14 - 6)  # keys 6..13: the first query (10) sees 6..10
    assert group.context_index.tolist() == chunk.groups[0].context_index[6:].tolist()
    assert group.mask is not None and group.mask.shape == (1, 1, 4 * 2, 8)
    assert group.mask.sum(-1).flatten().tolist() == [5] * 8  # each query row twice (two heads per KV head)
    assert group.mask[0, 0, 0].nonzero().flatten().tolist() == [0, 1, 2, 3, 4]
    assert group.mask[0, 0, 7].nonzero().flatten().tolist() == [3, 4, 5, 6, 7]
    mixed = windowed(build_metadata([(table, 0, 20), (table, 12, 1), (table, 3, 1)], 4, cpu), window)
    decode, prefill = mixed.groups
    assert decode.mask is not None and decode.shape == (2, 1, 13)
    assert decode.mask.view(2, -1)[0].nonzero().flatten().tolist() == [8, 9, 10, 11, 12]
    assert decode.mask.view(2, -1)[1].nonzero().flatten().tolist() == [0, 1, 2, 3]
    assert prefill.mask is not None and prefill.mask[0, 0, 19].nonzero().flatten().tolist() == [
        15,
        16,
        17,
        18,
        19,
    ]
    assert prefill.mask[0, 0, 0].nonzero().flatten().tolist() == [0]
    full = windowed(build_metadata([(table, 12, 1), (table, 11, 1)], 4, cpu), window).groups[0]
    assert full.shape == (2, 1, 13 - 7)  # the oldest key still seen is 11 - 4 = 7
    assert full.mask is not None and full.mask.view(2, -1).sum(-1).tolist() == [5, 5]
    uniform = build_metadata([(table, 12, 1), (table, 12, 1)], 4, cpu)
    assert uniform.groups[0].mask is None
    same = windowed(uniform, window).groups[0]
    assert same.shape == (2, 1, 5) and same.mask is not None and bool(same.mask.all())
    span = windowed(build_metadata([(table, 10, 4)], 4, cpu, "per_seq"), window).spans[0]
    assert len(span.context_slots) == 14 - 6
    assert span.mask is not None and span.mask.sum(-1).tolist() == [5, 5, 5, 5]
    assert band(2, 4, 2, cpu).tolist() == [
        [False, True, True, False],
        [False, False, True, True],
    ]
    short = build_metadata([(table, 2, 2)], 4, cpu)
    assert windowed(short, window) is short
