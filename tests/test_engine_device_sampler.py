"""The CUDA engine's batched sampler (device_sampler.py), run on CPU tensors: same semantics as sampler.py."""

import pytest
import torch
from test_engine_serving_fakes import FakeDetokenizer, FakeRunner, fake_probs, next_token

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.device_sampler import (
    DeviceSampler,
    exponential_noise,
    penalize_dense,
    truncate_dense,
)
from backends.local_engine.engine.llm_engine import LLMEngine
from backends.local_engine.engine.sampler import penalize, truncate
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.sequence import Sequence

VOCAB = 50


def logits_of(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def seq(params: SamplingParams, prompt: list[int] | None = None) -> Sequence:
    return Sequence(list(prompt or [1, 2, 3]), params)


def test_greedy_rows_take_the_argmax() -> None:
    logits = logits_of(4)
    seqs = [seq(SamplingParams(temperature=0.0)) for _ in range(4)]
    assert DeviceSampler().sample(logits, seqs) == logits.argmax(-1).tolist()


def test_a_seeded_request_draws_the_same_token_whatever_shares_the_batch() -> None:
    logits = logits_of(3)
    seeded = seq(SamplingParams(seed=1234))
    others = [seq(SamplingParams()), seq(SamplingParams(temperature=0.0))]
    alone = DeviceSampler(1).sample(logits[:1], [seeded])
    batched = DeviceSampler(2).sample(logits, [seeded, *others])
    assert batched[0] == alone[0]
    draws = {DeviceSampler(seed).sample(logits[:1], [seq(SamplingParams())])[0] for seed in range(40)}
    assert len(draws) > 1  # unseeded rows do vary


def test_samples_follow_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [1e-9] * (VOCAB - 4)]))
    sampler = DeviceSampler(0)
    counts = torch.zeros(VOCAB)
    for _ in range(2000):
        counts[sampler.sample(logits, [seq(SamplingParams())])[0]] += 1
    assert torch.allclose(counts[:4] / 2000, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.04)


def test_exponential_noise_is_exp1_and_depends_only_on_key_and_token() -> None:
    noise = exponential_noise(torch.tensor([7, 8], dtype=torch.int64), 20000)
    assert abs(float(noise.mean()) - 1.0) < 0.03 and float(noise.min()) > 0
    assert torch.equal(noise[0, :100], exponential_noise(torch.tensor([7], dtype=torch.int64), 100)[0])
    assert not torch.equal(noise[0], noise[1])


def test_dense_penalties_and_truncation_equal_the_per_request_sampler() -> None:
    params = [
        SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2),
        SamplingParams(top_k=5, temperature=0.7, min_tokens=3, eos_token_ids=(0, 4), stop_token_ids=[6]),
        SamplingParams(top_p=0.8, min_p=0.05, logit_bias={3: 2.5, 0: -100.0}),
        SamplingParams(),
    ]
    prompts, outputs = [[1, 2, 3], [4], [5, 6], []], [[2, 2, 9], [], [7], [1]]
    logits = logits_of(4, seed=3)
    expected = penalize(logits, params, prompts, outputs)
    assert torch.allclose(penalize_dense(logits, params, prompts, outputs), expected, atol=1e-6)
    got, want = truncate_dense(expected, params), truncate(expected, params)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.allclose(got[~torch.isinf(got)], want[~torch.isinf(want)], atol=1e-6)


def test_engine_samples_plain_steps_through_the_batched_sampler() -> None:
    settings = EngineSettings(max_model_len=256, max_num_batched_tokens=32, max_num_seqs=8)
    calls: list[int] = []
    sampler = DeviceSampler(0)

    def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        calls.append(len(seqs))
        return sampler.sample(logits, seqs)

    engine = LLMEngine(settings, FakeRunner(num_blocks=64), fake_probs, FakeDetokenizer, sample)
    prompts = [[7, 8, 9], list(range(1, 20))]
    ids = {engine.add_request(p, SamplingParams(max_tokens=6, temperature=0.0)): p for p in prompts}
    outputs = {seq_id: [] for seq_id in ids}
    while engine.has_work:
        for out in engine.step():
            outputs[out.seq_id] += out.new_token_ids
    for seq_id, prompt in ids.items():
        tokens = list(prompt)
        for _ in range(6):
            tokens.append(next_token(tokens))
        assert outputs[seq_id] == tokens[len(prompt) :]
    assert calls and max(calls) == 2  # one batched call per step


@pytest.mark.parametrize("vocab", [49152, 128256, 1000, 130])
def test_two_pass_argmax_matches_argmax_with_ties(vocab: int) -> None:
    from backends.local_engine.engine.device_sampler import argmax_rows

    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, vocab, generator=generator)
    logits[1, vocab // 3] = logits[1, vocab - 1] = 50.0  # a tie: the first maximum wins
    logits[2] = 0.0
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
    assert argmax_rows(logits)[1] == vocab // 3 and argmax_rows(logits)[2] == 0
