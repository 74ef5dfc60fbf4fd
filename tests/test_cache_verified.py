"""Verified mode (cache/verified.py, cache/verified_mode.py): the statistics, a simulation with a known error
rate per entry where the served error must stay ≤ δ, and the mode at work in the cache stages."""

import math
from typing import Any

import numpy as np
import pytest
from scipy.stats import beta, binom

from cache.config import CachePolicy, CacheSettings, SemanticPolicy, VerifiedSettings
from cache.service import CacheService
from cache.shadow import AnswerMatcher, ShadowChecker
from cache.store import MemoryStore
from cache.vector_index import SemanticIndex
from cache.verified import (
    NOTHING,
    VerifiedLearner,
    binomial_cdf,
    certified_threshold,
    exceeds,
    minimum_outcomes,
)
from cache.verified_mode import VerifiedMode
from cache.verifier import Verdict
from core.reply import Reply
from tests.cache_helpers import USAGE, Upstream, _choice, _head, ctx_for, pipeline
from tests.test_cache_semantic_safety import DIM, ChangingUpstream, SameVectorEmbedder


@pytest.mark.parametrize(("k", "n", "p"), [(0, 10, 0.1), (3, 100, 0.02), (20, 1000, 0.03), (5, 5000, 0.001)])
def test_binomial_cdf_matches_scipy(k: int, n: int, p: float) -> None:
    assert binomial_cdf(k, n, p) == pytest.approx(binom.cdf(k, n, p), rel=1e-9)


@pytest.mark.parametrize(("k", "n"), [(0, 149), (0, 150), (1, 240), (1, 300), (2, 300), (6, 300), (12, 1000)])
def test_the_bound_is_clopper_pearsons(k: int, n: int) -> None:
    upper = beta.ppf(0.95, k + 1, n - k)
    assert exceeds(k, n, 0.02, 0.95) == (upper > 0.02)


def test_the_fewest_outcomes_that_certify() -> None:
    assert [minimum_outcomes(d, 0.95) for d in (0.01, 0.02, 0.05)] == [299, 149, 59]


def test_fixed_sequence_stops_at_the_first_failing_level() -> None:
    right = np.full(400, 0.95)
    wrong_band = np.full(200, 0.70)  # half of them wrong
    scores = np.concatenate([right, wrong_band, np.full(400, 0.50)])
    wrong = np.concatenate([np.zeros(400), np.arange(200) % 2, np.zeros(400)]).astype(np.int64)
    # the right outcomes at 0.50 cannot buy back the wrong band above them: testing stops there
    assert certified_threshold(scores, wrong, 0.02, 0.95) == pytest.approx(0.71)
    assert certified_threshold(scores[:100], wrong[:100], 0.02, 0.95) == NOTHING  # too few to certify


def simulate(
    delta: float, seed: int, hardest: float, steps: int = 6000, entries: int = 200, shadow: float = 0.1
) -> tuple[int, int, float]:
    """Entries whose answers serve a question scored s with a known probability (a logistic curve of their
    own, half right at a score up to `hardest`: some entries serve loose paraphrases, others only
    near-copies). Unserved candidates are labelled (explored), a share of served ones too (shadow);
    returns (served, wrong among them, the expected number of wrong ones by the known rates)."""
    rng = np.random.default_rng(seed)
    learner = VerifiedLearner(VerifiedSettings())
    centre, slope = rng.uniform(0.3, hardest, entries), rng.uniform(0.02, 0.08, entries)
    popularity = np.cumsum(1 / np.arange(1, entries + 1))
    picks = np.searchsorted(popularity / popularity[-1], rng.random(steps))
    scores, draws, shadows = rng.beta(4, 2, steps), rng.random(steps), rng.random(steps)
    served = wrong_served = 0
    expected = 0.0
    for e, score, draw, shadow_draw in zip(picks, scores, draws, shadows, strict=True):
        rate = 1 / (1 + math.exp((score - centre[e]) / slope[e]))
        wrong = draw < rate
        if learner.decide("ns", str(e), float(score), delta).serve:
            served, wrong_served, expected = served + 1, wrong_served + wrong, expected + rate
            if shadow_draw < shadow:
                learner.record("ns", str(e), float(score), bool(wrong))
        else:
            learner.record("ns", str(e), float(score), bool(wrong))
    return served, wrong_served, expected


@pytest.mark.parametrize("delta", [0.01, 0.02, 0.05])
@pytest.mark.parametrize("hardest", [0.8, 0.95])
def test_served_error_stays_within_the_bound_in_simulation(delta: float, hardest: float) -> None:
    total_served = total_wrong = 0
    for seed in range(4):
        served, wrong, expected = simulate(delta, seed, hardest)
        assert expected <= delta * served, (seed, served, wrong, expected)  # the known error rate
        total_served, total_wrong = total_served + served, total_wrong + wrong
    assert total_wrong <= delta * total_served  # and the measured one
    if (
        delta == 0.05 and hardest <= 0.8
    ):  # it does learn to serve (a rule that never serves passes the bound);
        assert total_served > 500  # δ = 0.02 needs more outcomes than 6,000 steps give (bench/README.md)


def test_an_entry_mostly_wrong_at_a_score_never_serves_at_or_below_it() -> None:
    learner = VerifiedLearner(VerifiedSettings())
    learner.record("ns", "e0", 0.9, False)
    assert not learner.decide("ns", "e1", 0.9, 0.02).serve  # δ = 0.02 is in use from now on
    for i in range(400):
        learner.record("ns", f"e{i % 50}", 0.9, False)
    assert learner.decide("ns", "e1", 0.9, 0.02).serve
    learner.record("ns", "e1", 0.92, True)  # its only outcome at ≥ 0.92 is wrong
    assert not learner.decide("ns", "e1", 0.92, 0.02).serve and learner.decide("ns", "e1", 0.95, 0.02).serve
    assert learner.decide("ns", "e2", 0.92, 0.02).serve  # others keep the namespace's threshold
    assert not learner.decide("other", "e2", 0.99, 0.02).serve  # another namespace has no evidence


def test_one_high_scoring_look_alike_among_many_right_paraphrases_does_not_close_an_entry() -> None:
    learner = VerifiedLearner(VerifiedSettings())
    learner.decide("ns", "e", 0.9, 0.05)
    for _ in range(200):
        learner.record("ns", "e", 0.97, False)
    learner.record("ns", "e", 0.96, True)
    assert learner.decide("ns", "e", 0.965, 0.05).serve  # 1 wrong in 201 at ≥ 0.96: under δ
    for _ in range(20):
        learner.record("ns", "e", 0.96, True)
    assert not learner.decide("ns", "e", 0.96, 0.05).serve  # 21 in 221: over δ, closed at ≤ 0.96


def test_semantic_policy_reads_booleans_and_modes() -> None:
    assert CachePolicy().semantic.mode == "off"  # the safe default
    assert CachePolicy(semantic=True).semantic.mode == "static"
    assert CachePolicy.model_validate({"semantic": "false"}).semantic.mode == "off"
    assert CachePolicy.model_validate({"semantic": {"mode": "verified", "max_error": 0.05}}).semantic == (
        SemanticPolicy(mode="verified", max_error=0.05)
    )
    with pytest.raises(ValueError):
        CachePolicy.model_validate({"semantic": {"mode": "sometimes"}})


class SteadyUpstream(Upstream):
    """The same answer every call: paraphrases agree."""

    async def __call__(self, ctx: Any) -> Reply:
        self.calls += 1
        message = {"role": "assistant", "content": self.text}
        return Reply(body={**_head("chat.completion"), "choices": [_choice(message, "stop")], "usage": USAGE})


class ScoredVerifier:
    def threshold_for(self, min_precision: float) -> float:
        return 0.5

    def judge_all(self, stored: list[Any], new: Any, threshold: float) -> list[Verdict]:
        return [Verdict(threshold <= 0.9, 0.9) for _ in stored]


async def verified_service(max_error: float = 0.05) -> CacheService:
    embedder = SameVectorEmbedder()
    policy = CachePolicy(semantic={"mode": "verified", "max_error": max_error})
    settings = CacheSettings(sweep_interval_s=3600, index="flat", defaults=policy)
    matcher = AnswerMatcher(embedder, "exact", 0.8)
    store = MemoryStore()
    verified = VerifiedMode(settings.verified, matcher, ShadowChecker(matcher, 0.0), store.get)
    cache = CacheService(
        settings, store, SemanticIndex(DIM, "flat"), embedder, ScoredVerifier(), None, verified
    )  # type: ignore[arg-type]
    await cache.store.start(cache.index)
    return cache


async def ask_many(cache: CacheService, upstream: Upstream, count: int) -> list[str]:
    handler = pipeline(cache, upstream)
    await handler(ctx_for(question="What is the capital of France?"))
    await cache.settle()
    statuses = []
    for i in range(count):
        reply = await handler(
            ctx_for(question=f"capital of France, please {i}", headers={"cache-control": "no-store"})
        )
        await cache.settle()
        statuses.append(reply.headers["x-cache-status"])
    return statuses


async def test_verified_mode_serves_once_agreeing_answers_certify_it() -> None:
    cache = await verified_service(max_error=0.05)
    statuses = await ask_many(cache, SteadyUpstream(), 150)
    first_hit = statuses.index("semantic-hit")  # each miss before it explored the stored answer: it agreed
    assert minimum_outcomes(0.05, 0.95) <= first_hit <= 2 * minimum_outcomes(0.05, 0.95) + 1
    assert set(statuses[:first_hit]) == {"miss"} and set(statuses[first_hit:]) == {"semantic-hit"}


async def test_verified_mode_never_serves_when_fresh_answers_disagree() -> None:
    cache = await verified_service(max_error=0.05)
    statuses = await ask_many(cache, ChangingUpstream(), 70)
    assert set(statuses) == {"miss"}
    assert cache.verified is not None and cache.verified.learner.snapshot(0.05)
    (stats,) = cache.verified.learner.snapshot(0.05).values()
    assert stats["outcomes"] == 70 and stats["wrong"] == 70 and stats["threshold"] == NOTHING


async def test_feedback_on_a_verified_hit_teaches_a_wrong_outcome_and_evicts() -> None:
    cache = await verified_service(max_error=0.05)
    upstream = SteadyUpstream()
    statuses = await ask_many(cache, upstream, 130)
    assert statuses[-1] == "semantic-hit"
    handler = pipeline(cache, upstream)
    reply = await handler(ctx_for(question="capital of France?", headers={"x-cache-feedback": "wrong"}))
    await cache.settle()
    assert reply.headers["x-cache-status"] == "miss"
    assert cache.verified is not None
    (stats,) = cache.verified.learner.snapshot(0.05).values()
    assert stats["wrong"] == 1
