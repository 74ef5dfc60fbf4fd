"""What the verifier reads about a pair of questions: how well each word of one finds a counterpart in
the other (contextual MiniLM word vectors), which words are left over, whether shared words kept their
order and role, and a few closed-class facts (negation, units, capitalised names, question words).
Every feature is symmetric in the two questions. Five of the last six (added for issue 13) read the words left
over once spelling slips are forgiven: a content word without its stem opposite but one edit away from
an unmatched word there ("mercruy" / "mercury", same first letter, both ≥ 5 letters) counts as matched,
and words that only wrap a question ("thanks", "quick question") or ask for another form (instruction
words) are left out of the plain count; the sixth tells a swap across a directional word ("from X to Y",
"X than Y") from a reordering that keeps the meaning ("between X and Y"). Numbers are not a feature: differing numbers are an
exact rule (cache/verifier.py). What depends on one question alone (stems, parse, closed-class words) is
computed once per question text and kept (`words_of`), so a lookup pays it once, not per candidate:
four candidates took 6.5 ms p50 before and about a third of that after (docs/cache-measurements.md)."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from cache.encoder import EncodedQuestion
from cache.guard import CHECKS, Question, parse, stem, swapped_around_relation
from cache.lexicon import (
    AUXILIARIES,
    COURTESY_WORDS,
    FUNCTION_WORDS,
    INSTRUCTION_WORDS,
    NEGATIONS,
    SEQUENCE_WORDS,
)

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
    "typo_matches",  # content words matched only by a one-edit spelling variant, both sides
    "unmatched_plain_max", "unmatched_plain_min",  # unmatched content words: no typo, courtesy or instruction word
    "worst_match_typo_min", "worst_match_typo_max",  # worst content match, typo matches as 1, courtesy left out
    "relation_swapped",  # a shared word moved across a directional word ("from X to Y"), not just reordered
    "sequence_differs",  # first / next / last / latest ... : not the same set on both sides (issue 40)
    "polar_differs",  # one is a yes/no question ("Are bananas constipating?"), the other asks what/how/why
)  # fmt: skip


@dataclass(frozen=True)
class Words:
    """What the features read from one question on its own (computed once per question text)."""

    stems: tuple[str, ...]
    stem_set: frozenset[str]
    content: np.ndarray  # per word: neither a function word nor a number
    negations: int
    instructions: frozenset[str]
    question_words: frozenset[str]
    parsed: Question
    content_words: tuple[tuple[int, str], ...]  # (position, stem) of each content word
    single_content: tuple[str, ...]  # stems of content words that occur once, in order
    names: tuple[int, ...]  # positions of capitalised words past the first
    last: dict[str, int]  # stem -> its last position
    once: dict[str, int]  # stem -> its position, for stems that occur once
    units: tuple[str, ...]  # the parsed units, sorted
    sequence: frozenset[str]  # order words: first, next, last, latest, 2nd ...
    polar: bool  # opens with an auxiliary verb and asks no wh-question: a yes/no question


@lru_cache(maxsize=16_384)
def words_of(text: str, words: tuple[str, ...]) -> Words:
    stems = tuple(stem(w) for w in words)
    content = _content(stems)
    counts = Counter(stems)
    parsed = parse(text)
    positions = [int(i) for i in np.flatnonzero(content)]
    return Words(
        stems, frozenset(stems), content, _negations(stems), frozenset(_instructions(stems)),
        _question_words(stems), parsed, tuple((i, stems[i]) for i in positions),
        tuple(stems[i] for i in positions if counts[stems[i]] == 1),
        tuple(i for i, w in enumerate(words) if i > 0 and w[:1].isupper()),
        {s: i for i, s in enumerate(stems)}, {s: i for i, s in enumerate(stems) if counts[s] == 1},
        tuple(sorted(parsed.units)), frozenset(s for s in stems if s in SEQUENCE_WORDS), _polar(stems),
    )  # fmt: skip


def candidate_features(stored: Sequence[EncodedQuestion], new: EncodedQuestion) -> np.ndarray:
    """One row of FEATURES per (stored question, new question) pair."""
    if not stored:
        return np.zeros((0, len(FEATURES)), dtype=np.float32)
    return np.stack([pair_features(s, new) for s in stored])


def pair_features(a: EncodedQuestion, b: EncodedQuestion) -> np.ndarray:
    """Everything about one question alone comes precomputed from `words_of`; per pair there are the
    similarity matrix, its row and column maxima and two float32 sums per side (in numpy, as before),
    and lookups of the few content words in the other side's tables. The values are those of the
    earlier per-word loops to the bit (tests/test_cache_fast_paths.py)."""
    sims = (
        a.word_vectors @ b.word_vectors.T
        if len(a.words) and len(b.words)
        else np.zeros((len(a.words), len(b.words)))
    )
    best_a = sims.max(axis=1) if sims.size else np.zeros(len(a.words))
    best_b = sims.max(axis=0) if sims.size else np.zeros(len(b.words))
    wa, wb = words_of(a.text, a.words), words_of(b.text, b.words)
    side_a, side_b = _side(best_a, wa, wb.stem_set), _side(best_b, wb, wa.stem_set)
    pa, pb = wa.parsed, wb.parsed
    union = wa.stem_set | wb.stem_set
    values = [
        float(a.vector @ b.vector),
        min(side_a.worst, side_b.worst), max(side_a.worst, side_b.worst),
        min(side_a.mean, side_b.mean), max(side_a.mean, side_b.mean),
        max(side_a.weak, side_b.weak), min(side_a.weak, side_b.weak),
        max(side_a.unmatched, side_b.unmatched), min(side_a.unmatched, side_b.unmatched),
        side_a.names + side_b.names,
        _worst_shared(sims, wa, wb),
        _discordance(wa, wb),
        min(len(a.words), len(b.words)) / max(len(a.words), len(b.words), 1),
        max(len(a.words), len(b.words)) / 20,
        float(wa.negations != wb.negations),
        float(wa.units != wb.units),
        float(wa.question_words != wb.question_words),
        len(wa.stem_set & wb.stem_set) / max(len(union), 1),
        max(side_a.deficit, side_b.deficit),
        len(wa.instructions ^ wb.instructions),
        *(float(check(pa, pb)) for check in _EVIDENCE_CHECKS),
        *_leftovers(best_a, best_b, wa, wb),
        float(swapped_around_relation(pa, pb)),
        float(wa.sequence != wb.sequence), float(wa.polar != wb.polar),
    ]  # fmt: skip
    return np.asarray(values, dtype=np.float32)


def _leftovers(best_a: np.ndarray, best_b: np.ndarray, wa: Words, wb: Words) -> list[float]:
    """typo_matches, unmatched_plain max/min, worst_match_typo min/max (see the module's docstring)."""
    left_a = [(i, s) for i, s in wa.content_words if s not in wb.stem_set]
    left_b = [(i, s) for i, s in wb.content_words if s not in wa.stem_set]
    typo_a = {i for i, s in left_a if any(_one_edit(s, t) for _, t in left_b)}
    typo_b = {i for i, s in left_b if any(_one_edit(s, t) for _, t in left_a)}
    plain_a = sum(1 for i, s in left_a if i not in typo_a and s not in _WRAPPING)
    plain_b = sum(1 for i, s in left_b if i not in typo_b and s not in _WRAPPING)
    worst_a, worst_b = _worst_forgiving(best_a, wa, typo_a), _worst_forgiving(best_b, wb, typo_b)
    return [
        float(len(typo_a) + len(typo_b)), float(max(plain_a, plain_b)), float(min(plain_a, plain_b)),
        min(worst_a, worst_b), max(worst_a, worst_b),
    ]  # fmt: skip


_WRAPPING = COURTESY_WORDS | INSTRUCTION_WORDS


def _worst_forgiving(best: np.ndarray, words: Words, typos: set[int]) -> float:
    scores = [
        1.0 if i in typos else float(best[i]) for i, s in words.content_words if s not in COURTESY_WORDS
    ]
    return min(scores, default=1.0)


def _one_edit(a: str, b: str) -> bool:
    """One deletion, insertion, substitution or swap of neighbours apart; both ≥ 5 letters, same first letter."""
    if len(a) < 5 or len(b) < 5 or a[0] != b[0] or a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and a[diff[0]] == b[diff[1]]
            and a[diff[1]] == b[diff[0]]
        )
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((k for k in range(len(short)) if short[k] != long[k]), len(short))
    return short[i:] == long[i + 1 :]


_EVIDENCE_CHECKS = tuple(CHECKS[name] for name in ("swap", "antonym", "time"))  # evidence, not rules


@dataclass(frozen=True)
class _Side:
    worst: float
    mean: float
    weak: int
    unmatched: int
    names: int
    deficit: float


def _side(best: np.ndarray, words: Words, other: frozenset[str]) -> _Side:
    """One question's side: `best` similarity of each word's best counterpart opposite. A side without
    content words scores as one perfect match. Comparing a float32 value as a Python float with 0.6 or
    0.8 gives what numpy's float32 comparison gives (no float32 lies between 0.6 and float32(0.6))."""
    if not words.content_words:
        scores = np.ones(1, dtype=np.float32)
        worst, weak = 1.0, 0
    else:
        scores = best[words.content]
        content_best = scores.tolist()
        worst, weak = min(content_best), sum(1 for x in content_best if x < 0.6)
    values = best.tolist()
    return _Side(
        worst, _mean(scores), weak, sum(1 for _, s in words.content_words if s not in other),
        sum(1 for i in words.names if words.stems[i] not in other and values[i] < 0.8),
        float(np.add.reduce(1 - scores)),
    )  # fmt: skip


def _mean(scores: np.ndarray) -> float:
    """`float(scores.mean())` without numpy's Python wrapper: the same sum, divided the same way."""
    total = np.add.reduce(scores)
    return float(total.dtype.type(total / np.intp(len(scores))))


def _content(stems: Sequence[str]) -> np.ndarray:
    return np.array([s not in FUNCTION_WORDS and not s.isdigit() for s in stems], dtype=bool)


def _worst_shared(sims: np.ndarray, wa: Words, wb: Words) -> float:
    """Lowest contextual similarity between occurrences of one content word on both sides (a word of
    the first question against the last occurrence of its stem in the second)."""
    pairs = [(i, wb.last[s]) for i, s in wa.content_words if s in wb.last]
    return min([1.0, *(float(sims[i, j]) for i, j in pairs)])


def _discordance(wa: Words, wb: Words) -> float:
    """Share of pairs of shared content words (each once on both sides) that appear in the other order."""
    order = [wb.once[s] for s in wa.single_content if s in wb.once]
    pairs = len(order) * (len(order) - 1) / 2
    if not pairs:
        return 0.0
    flipped = sum(1 for i in range(len(order)) for j in range(i + 1, len(order)) if order[i] > order[j])
    return flipped / pairs


def _negations(stems: Sequence[str]) -> int:
    return sum(1 for s in stems if s in NEGATIONS or s == "t" or s.endswith("n't"))


def _instructions(stems: Sequence[str]) -> set[str]:
    return {s for s in stems if s in INSTRUCTION_WORDS}


def _polar(stems: Sequence[str]) -> bool:
    """A yes/no question: its first word is an auxiliary ("is", "does", "can" ...) and no wh-word follows."""
    return bool(stems) and stems[0] in AUXILIARIES and not any(s in _QUESTION_WORDS for s in stems)


def _question_words(stems: Sequence[str]) -> frozenset[str]:
    return frozenset(s for s in stems if s in _QUESTION_WORDS)
