"""The semantic cache's fast paths against the per-word loops they replaced (tests/cache_reference.py), on
a fixed set of questions and pairs: word vectors equal to the bit, pair features and verifier
probabilities equal (within 1e-6, in practice to the bit), the same verdicts, the same swap checks."""

import numpy as np
import pytest

from bench.cache_latency import questions
from cache.alignment import FEATURES, candidate_features, pair_features
from cache.config import CachePolicy
from cache.embedder import SentenceEmbedder
from cache.encoder import EncodedQuestion, QuestionEncoder, _question, normalise
from cache.guard import parse, swapped_around_relation
from cache.verifier import exact_conflict
from tests import cache_reference as reference
from tests.test_cache_verifier import NEGATIVES, PARAPHRASES

ODD = [
    "???", "", "a", "Is Paris larger than London? Paris!", "What's up, Doc Brown—really?",
    "tl;dr 3.14 km/h vs 2,000 mph", "Napoleon invade Russia Napoleon", "ÉCOLE école naïve café's",
    "convert miles to km", "convert km to miles", "flights from Paris to London to Rome",
    "Was the SQL JOIN of A and B larger than B's JOIN of A?", "unbelievably antidisestablishmentarianism",
]  # fmt: skip


def _texts() -> list[str]:
    stored, asked = questions()
    pairs = [t for pair in [*PARAPHRASES, *NEGATIVES.values()] for t in pair]
    return [*pairs, *ODD, *stored[::23][:120], *asked[::23][:120]]


@pytest.fixture(scope="module")
def encoded(encoder: QuestionEncoder) -> list[tuple[EncodedQuestion, EncodedQuestion]]:
    """(fast, reference) encodings of each question, from the same tokens and hidden states."""
    tokenizer, transformer = encoder._tokenizer, encoder._transformer
    out = []
    for text in map(normalise, _texts()):  # the form the encoder encodes
        encoding = tokenizer.encode_batch([text])[0]
        ids = np.asarray([encoding.ids], dtype=np.int64)
        hidden = transformer(ids, np.ones_like(ids))[0]
        out.append((_question(text, encoding, hidden), reference.question(text, encoding, hidden)))
    return out


def test_word_vectors_equal_the_per_word_loop_to_the_bit(encoded):
    for fast, slow in encoded:
        assert fast.words == slow.words, fast.text
        assert np.array_equal(fast.vector, slow.vector), fast.text
        assert fast.word_vectors.shape == slow.word_vectors.shape, fast.text
        assert np.array_equal(fast.word_vectors, slow.word_vectors), fast.text


def test_encode_gives_the_fast_path(encoder, encoded):
    fast, _ = encoded[0]
    (again,) = encoder.encode([fast.text])
    assert again.words == fast.words and np.array_equal(again.word_vectors, fast.word_vectors)


def _pairs(encoded: list) -> list[tuple[EncodedQuestion, EncodedQuestion]]:
    questions_ = [fast for fast, _ in encoded]
    rng = np.random.default_rng(13)
    named = [(questions_[2 * i], questions_[2 * i + 1]) for i in range(len(PARAPHRASES) + len(NEGATIVES))]
    drawn = [(questions_[i], questions_[j]) for i, j in rng.integers(0, len(questions_), size=(600, 2))]
    odd = [(a, b) for a in questions_[len(named) * 2 : len(named) * 2 + len(ODD)] for b in questions_[:40:3]]
    return named + [(b, a) for a, b in named] + odd + drawn


def test_pair_features_and_probabilities_equal_the_reference(encoded, verifier):
    pairs = _pairs(encoded)
    fast = np.stack([pair_features(a, b) for a, b in pairs])
    slow = np.stack([_reference_row(a, b) for a, b in pairs])
    assert fast.shape == (len(pairs), len(FEATURES))
    assert np.abs(fast - slow).max() <= 1e-6
    assert np.abs(verifier.probabilities(fast) - verifier.probabilities(slow)).max() <= 1e-6


def test_a_lookup_judges_its_candidates_as_the_reference_does(encoded, verifier):
    """Verdicts of judge_all (all candidates at once) = threshold and exact rules on reference probabilities."""
    questions_ = [fast for fast, _ in encoded]
    threshold = verifier.threshold_for(CachePolicy().semantic_min_precision)
    rng = np.random.default_rng(7)
    lookups = [([questions_[2 * i]], questions_[2 * i + 1]) for i in range(len(PARAPHRASES))]
    for new_at in range(0, len(questions_), 3):
        stored = [questions_[i] for i in rng.integers(0, len(questions_), size=rng.integers(1, 5))]
        lookups.append((stored, questions_[new_at]))
    accepted = 0
    for stored, new in lookups:
        slow = verifier.probabilities(np.stack([_reference_row(s, new) for s in stored]))
        for s, verdict, p in zip(stored, verifier.judge_all(stored, new, threshold), slow, strict=True):
            if exact_conflict(s, new):
                assert (verdict.accepted, verdict.probability) == (False, 0.0)
            else:
                assert verdict.accepted == (p >= threshold) and verdict.probability == pytest.approx(
                    p, abs=1e-6
                )
            accepted += verdict.accepted
    assert accepted >= len(PARAPHRASES) - 1  # paraphrases are among the lookups: hits are compared too


def _reference_row(a: EncodedQuestion, b: EncodedQuestion) -> np.ndarray:
    """The reference's features (those older than issue 13), then the later ones as the fast code makes
    them: they never had a slower twin (their own tests: tests/test_cache_verifier.py)."""
    older = reference.pair_features(a, b)
    return np.concatenate([older, pair_features(a, b)[len(older) :]])


def test_no_candidates_give_no_rows(encoded):
    assert candidate_features([], encoded[0][0]).shape == (0, len(FEATURES))


def test_swap_check_equals_the_reference():
    texts = [*_texts(), "transfer money from savings to checking", "transfer money from checking to savings"]
    parsed = [parse(t) for t in texts]
    rng = np.random.default_rng(3)
    pairs = [(parsed[i], parsed[j]) for i, j in rng.integers(0, len(parsed), size=(3000, 2))]
    pairs += [(a, b) for a in parsed[-8:] for b in parsed[-8:]]
    swapped = 0
    for a, b in pairs:
        assert swapped_around_relation(a, b) == reference.swapped_around_relation(a, b)
        swapped += reference.swapped_around_relation(a, b)
    assert swapped >= 2  # the set has swaps to find, so the equality above means something


async def test_the_embedder_prepares_the_words_it_returns(encoder):
    """The words analysed while the worker encodes are those of the question it returns (the verifier's
    table lookup then hits its cache); a failing preparation does not fail the encoding."""
    seen: list[tuple[str, tuple[str, ...]]] = []
    embedder = SentenceEmbedder(encoder, prepare=lambda text, words: seen.append((text, words)))
    question = await embedder.embed("How tall is the Eiffel Tower, in feet?")
    assert seen == [(question.text, question.words)] and question.words
    await embedder.aclose()
    failing = SentenceEmbedder(encoder, prepare=lambda *_: 1 / 0)
    assert (await failing.embed(question.text)).words == question.words
    await failing.aclose()
