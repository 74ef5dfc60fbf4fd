"""Sampling: greedy, temperature, top-k/top-p/min-p, penalties, seeds independent of the batch, logprobs."""

import math

import torch

from backends.local_engine.engine.sampler import Sampler, penalize, probabilities
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.sequence import Sequence

VOCAB = 50


def make_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def seq(params: SamplingParams, prompt: list[int] | None = None) -> Sequence:
    return Sequence(list(prompt or [1, 2, 3]), params)


def test_greedy_takes_the_argmax() -> None:
    logits = make_logits(4)
    seqs = [seq(SamplingParams(temperature=0.0)) for _ in range(4)]
    assert Sampler().sample(logits, seqs).token_ids == logits.argmax(dim=-1).tolist()


def test_top_k_keeps_exactly_k_tokens() -> None:
    probs = probabilities(make_logits(1), [SamplingParams(top_k=3)], [[]], [[]])
    assert int((probs > 0).sum()) == 3
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-5)


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = probabilities(logits, [SamplingParams(top_p=0.7)], [[]], [[]])[0]
    assert (probs > 0).tolist() == [True, True, False, False]
    assert torch.allclose(probs[:2], torch.tensor([0.625, 0.375]))


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = probabilities(logits, [SamplingParams(min_p=0.25)], [[]], [[]])[0]
    assert (probs > 0).tolist() == [True, True, True, False]


def test_temperature_sharpens_and_flattens() -> None:
    logits = make_logits(1)
    cold = probabilities(logits, [SamplingParams(temperature=0.5)], [[]], [[]])
    hot = probabilities(logits, [SamplingParams(temperature=2.0)], [[]], [[]])
    assert cold.max() > torch.softmax(logits, -1).max() > hot.max()


def test_penalties() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    out = penalize(logits, [params], [[0]], [[1, 2, 2]])[0]
    # token 0: prompt only -> repetition: 2/2; token 1: output once -> -2*2 - 0.5 - 0.25;
    # token 2: output twice -> 1/2 - 0.5 - 0.5; token 3: untouched
    assert torch.allclose(out, torch.tensor([1.0, -4.75, -0.5, 0.5]))


def test_repetition_penalty_changes_the_greedy_choice() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    plain = seq(SamplingParams(temperature=0.0), prompt=[0])
    penalized = seq(SamplingParams(temperature=0.0, repetition_penalty=1.5), prompt=[0])
    assert Sampler().sample(logits, [plain]).token_ids == [0]
    assert Sampler().sample(logits, [penalized]).token_ids == [1]


def run_steps(batch: list[Sequence], steps: int) -> list[list[int]]:
    sampler = Sampler(torch.Generator().manual_seed(99))
    for step in range(steps):
        logits = torch.stack([make_logits(1, seed=step * 7 + len(s.token_ids))[0] for s in batch])
        for s, token in zip(batch, sampler.sample(logits, batch).token_ids, strict=True):
            s.append_token(token)
    return [s.output_ids for s in batch]


def test_same_seed_same_output_whatever_the_batch() -> None:
    alone = run_steps([seq(SamplingParams(seed=42))], steps=8)[0]
    others = [seq(SamplingParams(seed=s, top_p=0.9)) for s in (1, 2)] + [seq(SamplingParams())]
    batched = run_steps([*others[:2], seq(SamplingParams(seed=42)), others[2]], steps=8)[2]
    different_seed = run_steps([seq(SamplingParams(seed=43))], steps=8)[0]
    assert alone == batched
    assert alone != different_seed


def test_samples_follow_the_distribution() -> None:
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    sampler = Sampler(torch.Generator().manual_seed(0))
    seqs = [seq(SamplingParams()) for _ in range(3000)]
    tokens = torch.tensor(sampler.sample(logits.expand(3000, 3), seqs).token_ids)
    frequencies = torch.bincount(tokens, minlength=3) / 3000
    assert torch.allclose(frequencies, torch.tensor([0.6, 0.3, 0.1]), atol=0.03)


def test_logprobs_are_those_of_the_raw_distribution() -> None:
    logits = make_logits(2)
    params = [SamplingParams(temperature=0.0, logprobs=True, top_logprobs=3), SamplingParams(temperature=0.0)]
    out = Sampler().sample(logits, [seq(p) for p in params])
    expected = torch.log_softmax(logits[0], -1)
    first = out.logprobs[0]
    assert first is not None and out.logprobs[1] is None
    assert math.isclose(first.logprob, float(expected.max()), rel_tol=1e-5)
    assert [t for t, _ in first.top] == expected.topk(3).indices.tolist()
    assert first.top[0] == (first.token_id, first.logprob)


def reference_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Straightforward full-sort version: the behaviour the fast path must reproduce."""
    ordered, order = logits.sort(descending=True)
    keep = torch.ones_like(ordered, dtype=torch.bool)
    if top_k:
        keep[top_k:] = False
    probs = torch.softmax(ordered.masked_fill(~keep, float("-inf")), dim=-1)
    keep &= (probs.cumsum(-1) - probs) < top_p
    return torch.zeros_like(keep).scatter(0, order, keep)


def test_fast_top_p_equals_a_full_sort_also_for_flat_distributions() -> None:
    vocab = 5000
    peaked = torch.randn(3, vocab, generator=torch.Generator().manual_seed(1)) * 4
    flat = torch.randn(3, vocab, generator=torch.Generator().manual_seed(2)) * 0.01  # nucleus >> 256 tokens
    logits = torch.cat([peaked, flat])
    logits = torch.cat([logits, flat[:1]])
    settings = [(0, 0.9), (50, 0.95), (2000, 0.99), (0, 0.5), (10, 1.0), (0, 0.97), (0, 1.0)]
    params = [SamplingParams(top_k=k, top_p=p) for k, p in settings]
    probs = probabilities(logits, params, [[]] * 7, [[]] * 7)
    for row, (k, p) in enumerate(settings):
        assert torch.equal(probs[row] > 0, reference_top_k_top_p(logits[row], k, p)), (k, p)
    assert int((probs[3] > 0).sum()) > 256  # the flat row really needed the fallback
    assert bool((probs[6] > 0).all())  # no top-k, top-p 1: nothing is dropped


def test_greedy_and_sampled_rows_mix_in_one_batch() -> None:
    logits = make_logits(3)
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=2), SamplingParams(temperature=0.0)]
    probs = probabilities(logits, params, [[]] * 3, [[]] * 3)
    assert probs[0].argmax() == logits[0].argmax() and float(probs[0].max()) == 1.0
    assert int((probs[1] > 0).sum()) == 2 and math.isclose(float(probs[1].sum()), 1.0, rel_tol=1e-5)


def test_penalties_apply_per_row_in_a_batch() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0], [2.0, -2.0, 1.0]])
    params = [SamplingParams(), SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0)]
    out = penalize(logits, params, [[0], [0]], [[2, 2], [2, 2]])
    assert torch.equal(out[0], logits[0])  # no penalties asked: untouched although it saw the same tokens
    assert torch.allclose(out[1], torch.tensor([1.0, -2.0, 0.5 - 2.0]))


def test_logit_bias_moves_the_greedy_choice_per_row_and_comes_before_the_penalties() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0], [2.0, -2.0, 1.0], [2.0, -2.0, 1.0]])
    params = [
        SamplingParams(temperature=0.0, logit_bias={1: 5.0}),  # -2 + 5 = 3: token 1 wins
        SamplingParams(temperature=0.0, logit_bias={0: -100.0}),  # the argmax banned: token 2 wins
        SamplingParams(temperature=0.0),
    ]
    probs = probabilities(logits, params, [[], [], []], [[], [], []])
    assert probs.argmax(dim=-1).tolist() == [1, 2, 0]
    # bias first, then the repetition penalty divides the biased (now positive) logit: (-2 + 4) / 2 = 1
    out = penalize(logits[:1], [SamplingParams(logit_bias={1: 4.0}, repetition_penalty=2.0)], [[1]], [[]])
    assert torch.allclose(out[0], torch.tensor([2.0, 1.0, 1.0]))


def test_min_tokens_holds_back_eos_and_stop_tokens_until_reached() -> None:
    logits = torch.tensor([[5.0, 4.0, 0.0, 1.0]] * 2)  # EOS (0) first, stop token (1) second
    params = SamplingParams(temperature=0.0, min_tokens=2, eos_token_ids=(0,), stop_token_ids=[1])
    probs = probabilities(logits, [params, params], [[], []], [[3], [3, 3]])
    assert probs.argmax(dim=-1).tolist() == [3, 0]  # one output token: held back; two: free again
