"""N-gram proposer and verification: greedy exactness and the rejection sampler's distribution."""

import torch
from scipy.stats import chisquare

from backends.local_engine.engine.speculative import (
    AcceptanceGate,
    NgramProposer,
    verify_greedy,
    verify_sampled,
)


def test_proposes_continuation_of_longest_latest_match():
    proposer = NgramProposer(num_speculative_tokens=3, ngram_min=1, ngram_max=3)
    tokens = [5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 4, 5, 6, 7]
    # the 3-gram [5, 6, 7] occurs twice before; the latest occurrence is followed by 2, 3, 4
    assert proposer.propose(tokens) == [2, 3, 4]
    assert proposer.propose(tokens, limit=1) == [2]


def test_falls_back_to_shorter_ngrams_and_to_nothing():
    proposer = NgramProposer(num_speculative_tokens=2, ngram_min=1, ngram_max=3)
    assert proposer.propose([1, 2, 3, 9, 3]) == [9, 3]
    assert proposer.propose([1, 2, 3, 4]) == []
    assert NgramProposer(2, 2, 3).propose([1, 2, 3, 9, 3]) == []


def test_greedy_accepts_the_argmax_prefix_then_corrects():
    probs = torch.eye(6)[[1, 2, 5, 4]]  # target argmax per position: 1, 2, 5, 4
    assert verify_greedy([1, 2, 3], probs) == [1, 2, 5]
    assert verify_greedy([1, 2, 5], probs) == [1, 2, 5, 4]
    assert verify_greedy([0, 2, 5], probs) == [1]


def test_rejection_sampling_preserves_the_target_distribution():
    torch.manual_seed(0)
    vocab = 5
    probs = torch.softmax(torch.randn(3, vocab) * 1.5, dim=-1)
    drafts = [2, 4]
    generator = torch.Generator().manual_seed(1)
    trials = 8000
    first_counts = torch.zeros(vocab)
    second_counts = torch.zeros(vocab)  # second token, given the first was accepted
    for _ in range(trials):
        out = verify_sampled(drafts, probs, generator)
        first_counts[out[0]] += 1
        if out[0] == drafts[0]:
            second_counts[out[1]] += 1
    for counts, target in ((first_counts, probs[0]), (second_counts, probs[1])):
        expected = (target * counts.sum()).numpy()
        assert chisquare(counts.numpy(), expected).pvalue > 0.001


def test_rejection_sampling_detects_a_wrong_sampler():
    """The statistical check above can fail: a sampler that always accepts is caught."""
    probs = torch.softmax(torch.tensor([[0.0, 1.0, 2.0]]), dim=-1)
    counts = torch.zeros(3)
    counts[2] = 5000  # "always accept draft 2" would produce this
    assert chisquare(counts.numpy(), (probs[0] * 5000).numpy()).pvalue < 0.001


def test_all_drafts_accepted_yields_a_bonus_token():
    probs = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    assert verify_sampled([1, 0], probs, torch.Generator().manual_seed(0)) == [1, 0, 1]


def test_acceptance_gate_pauses_a_sequence_whose_drafts_are_rejected_then_probes_again():
    gate = AcceptanceGate(min_acceptance=0.3, warmup=2, backoff=16)
    assert gate.allows(0)
    gate.record(4, 4, num_output_tokens=5)
    gate.record(4, 0, num_output_tokens=6)  # average 0.5: still on
    assert gate.allows(6)
    gate.record(4, 0, num_output_tokens=7)
    assert not gate.allows(7) and not gate.allows(22) and gate.allows(23)
    gate.record(4, 0, num_output_tokens=24)  # the probe fails: paused again
    assert not gate.allows(24)
    gate.record(0, 0, num_output_tokens=40)  # rounds without drafts change nothing
    assert gate.allows(40)


def test_acceptance_gate_stays_open_while_drafts_are_accepted():
    gate = AcceptanceGate(min_acceptance=0.3)
    for tokens in range(0, 100, 5):
        gate.record(4, 3, num_output_tokens=tokens)
        assert gate.allows(tokens)
