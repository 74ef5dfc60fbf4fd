"""What the verifier reads about a pair of questions: how well each word of one finds a counterpart in
the other (contextual MiniLM word vectors), which words are left over, whether shared words kept their
order and role, and a few closed-class facts (negation, units, capitalised names, question words).
Every feature is symmetric in the two questions. Numbers are not a feature: differing numbers are an
exact rule (cache/verifier.py). What depends on one question alone (stems, parse, closed-class words) is
computed once per question text and kept (`words_of`), so a lookup pays it once, not per candidate:
four candidates took 6.5 ms p50 before and about a third of that after (bench/README.md, "Caching")."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from cache.encoder import EncodedQuestion
from cache.guard import CHECKS, Question, parse, stem
from cache.lexicon import FUNCTION_WORDS, INSTRUCTION_WORDS, NEGATIONS

_QUESTION_WORDS = frozenset(["what", "which", "who", "whom", "whose", "when", "where", "why", "how"])

FEATURES = (
    "cosine",
    "worst_content_match_min", "worst_content_match_max",
    "mean_content_match_min", "mean_content_match_max",
    "weak_content_max", "weak_content_min",  # content words whose best match is below 0.6
    "unmatched_content_max", "unmatched_content_min",  # content words without the same stem opposite
    "unmatched_names",  # capitalised words (past the first) without a close counterpart
    "worst_shared_word_sim",  # the same word, used differently (role reversal)
    "order_discordance",
    "length_ratio", "length_max",
    "negation_differs", "unit_differs", "question_word_differs", "stem_jaccard",
    "deficit_sum_max",  # sum of (1 - best match) over content words, the worse side
    "unmatched_instruction_words",  # words asking for another form of answer, on one side only
    "arguments_swapped", "antonym_swapped", "time_differs",  # the old rule guard's checks, now only evidence
)  # fmt: skip


@dataclass(frozen=True)
class Words:
    """What the features read from one question on its own."""

    stems: tuple[str, ...]
    stem_set: frozenset[str]
    content: np.ndarray  # per word: neither a function word nor a number
    negations: int
    instructions: frozenset[str]
    question_words: frozenset[str]
    parsed: Question
    stem_array: np.ndarray  # the stems as a numpy string array (pairs compare them all at once)
    once: np.ndarray  # per word: its stem occurs once in the question
    names: np.ndarray  # per word: capitalised, and not the first word
    units: tuple[str, ...]  # the parsed units, sorted


@lru_cache(maxsize=16_384)
def words_of(text: str, words: tuple[str, ...]) -> Words:
    stems = tuple(stem(w) for w in words)
    parsed = parse(text)
    counts = Counter(stems)
    return Words(
        stems, frozenset(stems), _content(stems), _negations(stems), frozenset(_instructions(stems)),
        _question_words(stems), parsed, np.array(stems, dtype=str),
        np.array([counts[s] == 1 for s in stems], dtype=bool),
        np.array([i > 0 and w[:1].isupper() for i, w in enumerate(words)], dtype=bool), tuple(sorted(parsed.units)),
    )  # fmt: skip


def pair_features(a: EncodedQuestion, b: EncodedQuestion) -> np.ndarray:
    return candidate_features([a], b)[0]


def candidate_features(stored: Sequence[EncodedQuestion], new: EncodedQuestion) -> np.ndarray:
    """The FEATURES of each (stored question, new question) pair, one row per stored question, all
    candidates' words handled together: numpy over the words, no loop over them. Every value is
    computed from the same arrays in the same way as a pair at a time would (tests/test_cache_fast_paths.py
    pins them to the per-word loops): maxima, minima and counts over all candidates at once, the two
    float sums per side (mean, deficit) on each side's own array."""
    if not stored:
        return np.zeros((0, len(FEATURES)), dtype=np.float32)
    wb, was = words_of(new.text, new.words), [words_of(s.text, s.words) for s in stored]
    lengths = np.array([len(s.words) for s in stored], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    seg = np.repeat(np.arange(len(stored)), lengths)  # the candidate of each stored word
    m = len(new.words)
    # one product per candidate: one product of all their rows stacked can round differently (BLAS)
    sims = np.concatenate(
        [s.word_vectors @ new.word_vectors.T if len(s.words) and m else np.zeros((len(s.words), m), np.float32)
         for s in stored]
    )  # fmt: skip
    same = np.concatenate([w.stem_array for w in was])[:, None] == wb.stem_array[None, :]  # same stem
    content_a = np.concatenate([w.content for w in was])
    best_a = sims.max(axis=1) if sims.size else np.zeros(len(sims))
    matched_a = same.any(axis=1)
    nonempty = lengths > 0
    best_b = np.zeros((len(stored), m), dtype=best_a.dtype)
    matched_b = np.zeros((len(stored), m), dtype=bool)
    if m and nonempty.any():
        best_b[nonempty] = np.maximum.reduceat(sims, starts[nonempty], axis=0)
        matched_b[nonempty] = np.logical_or.reduceat(same, starts[nonempty], axis=0)
    capitalised_a = np.concatenate([w.names for w in was])
    worst_a, mean_a, weak_a, unmatched_a, names_a, deficit_a = _sides_a(
        best_a, content_a, matched_a, capitalised_a, seg, starts, lengths
    )
    worst_b, mean_b, weak_b, unmatched_b, names_b, deficit_b = _sides_b(
        best_b, wb.content, matched_b, wb.names
    )
    single_a = content_a & np.concatenate([w.once for w in was])
    out = np.empty((len(stored), len(FEATURES)), dtype=np.float64)
    out[:, 0] = [float(s.vector @ new.vector) for s in stored]
    out[:, 1], out[:, 2] = np.minimum(worst_a, worst_b), np.maximum(worst_a, worst_b)
    out[:, 3], out[:, 4] = np.minimum(mean_a, mean_b), np.maximum(mean_a, mean_b)
    out[:, 5], out[:, 6] = np.maximum(weak_a, weak_b), np.minimum(weak_a, weak_b)
    out[:, 7], out[:, 8] = np.maximum(unmatched_a, unmatched_b), np.minimum(unmatched_a, unmatched_b)
    out[:, 9] = names_a + names_b
    out[:, 10] = _worst_shared(sims, same, content_a, seg, len(stored))
    out[:, 11] = _discordance(same, single_a, wb.once, seg, len(stored))
    out[:, 12] = np.minimum(lengths, m) / np.maximum(np.maximum(lengths, m), 1)
    out[:, 13] = np.maximum(lengths, m) / 20
    out[:, 18] = np.maximum(deficit_a, deficit_b)
    for k, wa in enumerate(was):
        union = wa.stem_set | wb.stem_set
        out[k, 14:18] = (
            wa.negations != wb.negations, wa.units != wb.units, wa.question_words != wb.question_words,
            len(wa.stem_set & wb.stem_set) / max(len(union), 1),
        )  # fmt: skip
        out[k, 19] = len(wa.instructions ^ wb.instructions)
        out[k, 20:23] = [check(wa.parsed, wb.parsed) for check in _EVIDENCE_CHECKS]
    return out.astype(np.float32)


_EVIDENCE_CHECKS = tuple(CHECKS[name] for name in ("swap", "antonym", "time"))  # evidence, not rules


def _sides_a(
    best: np.ndarray, content: np.ndarray, matched: np.ndarray, names: np.ndarray, seg: np.ndarray,
    starts: np.ndarray, lengths: np.ndarray,
) -> tuple[np.ndarray, ...]:  # fmt: skip
    """worst, mean, weak, unmatched, names, deficit of each stored question's side (its words are the
    rows of segment k): `best` similarity of each word's best counterpart, `matched` whether its stem
    occurs opposite. A side without content words scores as one perfect match."""
    k = len(lengths)
    has = np.bincount(seg[content], minlength=k) > 0
    worst, mean, deficit = np.ones(k), np.ones(k), np.zeros(k)
    if has.any():
        masked = np.where(content, best, np.inf)
        nonempty = lengths > 0
        worst[nonempty] = np.minimum.reduceat(masked, starts[nonempty])
        worst[~has] = 1.0
        for i in np.flatnonzero(has).tolist():  # per candidate: the float sums on its side's own array
            scores = best[starts[i] : starts[i] + lengths[i]][content[starts[i] : starts[i] + lengths[i]]]
            mean[i], deficit[i] = float(scores.mean()), float((1 - scores).sum())
    weak = np.bincount(seg[content & (best < 0.6)], minlength=k)
    unmatched = np.bincount(seg[content & ~matched], minlength=k)
    name_count = np.bincount(seg[names & ~matched & (best < 0.8)], minlength=k)
    return worst, mean, weak, unmatched, name_count, deficit


def _sides_b(
    best: np.ndarray, content: np.ndarray, matched: np.ndarray, names: np.ndarray
) -> tuple[np.ndarray, ...]:
    """The same for the new question's side against each candidate (one row of `best` per candidate)."""
    scores = best[:, content] if content.any() else np.ones((len(best), 1), dtype=np.float32)
    return (
        scores.min(axis=1), np.array([float(row.mean()) for row in scores]), (scores < 0.6).sum(axis=1),
        (content & ~matched).sum(axis=1), (names & ~matched & (best < 0.8)).sum(axis=1),
        np.array([float((1 - row).sum()) for row in scores]),
    )  # fmt: skip


def _content(stems: Sequence[str]) -> np.ndarray:
    return np.array([s not in FUNCTION_WORDS and not s.isdigit() for s in stems], dtype=bool)


def _worst_shared(
    sims: np.ndarray, same: np.ndarray, content_a: np.ndarray, seg: np.ndarray, k: int
) -> np.ndarray:
    """Per candidate: the lowest contextual similarity between occurrences of one content word on both
    sides (a stored word against the last occurrence of its stem in the new question), else 1."""
    worst = np.ones(k)
    rows = np.flatnonzero(content_a & same.any(axis=1))
    if len(rows):
        last = same.shape[1] - 1 - np.argmax(same[rows, ::-1], axis=1)
        np.minimum.at(worst, seg[rows], sims[rows, last])
    return worst


def _discordance(
    same: np.ndarray, single_a: np.ndarray, once_b: np.ndarray, seg: np.ndarray, k: int
) -> np.ndarray:
    """Per candidate: the share of pairs of shared content words (each once on both sides) that appear
    in the other order."""
    once = same & once_b[None, :]  # each row: at most one column, the stem being once in the new question
    rows = np.flatnonzero(single_a & once.any(axis=1))
    counts = np.bincount(seg[rows], minlength=k)
    pairs = counts * (counts - 1) / 2
    if not pairs.any():
        return np.zeros(k)
    order, owner = np.argmax(once[rows], axis=1), seg[rows]
    later = np.triu((order[:, None] > order[None, :]) & (owner[:, None] == owner[None, :]), 1)
    flipped = np.bincount(owner, weights=later.sum(axis=1), minlength=k)
    return np.divide(flipped, pairs, out=np.zeros(k), where=pairs > 0)


def _negations(stems: Sequence[str]) -> int:
    return sum(1 for s in stems if s in NEGATIONS or s == "t" or s.endswith("n't"))


def _instructions(stems: Sequence[str]) -> set[str]:
    return {s for s in stems if s in INSTRUCTION_WORDS}


def _question_words(stems: Sequence[str]) -> frozenset[str]:
    return frozenset(s for s in stems if s in _QUESTION_WORDS)
