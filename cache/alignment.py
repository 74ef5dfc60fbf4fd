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
from cache.guard import Question, conflict, parse, stem
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
    """The FEATURES of one pair, with numpy over the words (no loop over them here): the stems of the
    two questions are compared as one matrix, whose rows and columns give each side's matches."""
    sims = (
        a.word_vectors @ b.word_vectors.T
        if len(a.words) and len(b.words)
        else np.zeros((len(a.words), len(b.words)))
    )
    best_a = sims.max(axis=1) if sims.size else np.zeros(len(a.words))
    best_b = sims.max(axis=0) if sims.size else np.zeros(len(b.words))
    wa, wb = words_of(a.text, a.words), words_of(b.text, b.words)
    same = wa.stem_array[:, None] == wb.stem_array[None, :]  # (words of a, words of b): the same stem
    side_a = _side(best_a, wa.content, same.any(axis=1), wa.names)
    side_b = _side(best_b, wb.content, same.any(axis=0), wb.names)
    pa, pb = wa.parsed, wb.parsed
    union = wa.stem_set | wb.stem_set
    values = [
        float(a.vector @ b.vector),
        min(side_a.worst, side_b.worst), max(side_a.worst, side_b.worst),
        min(side_a.mean, side_b.mean), max(side_a.mean, side_b.mean),
        max(side_a.weak, side_b.weak), min(side_a.weak, side_b.weak),
        max(side_a.unmatched, side_b.unmatched), min(side_a.unmatched, side_b.unmatched),
        side_a.names + side_b.names,
        _worst_shared(sims, same, wa.content),
        _discordance(same, wa, wb),
        min(len(a.words), len(b.words)) / max(len(a.words), len(b.words), 1),
        max(len(a.words), len(b.words)) / 20,
        float(wa.negations != wb.negations),
        float(wa.units != wb.units),
        float(wa.question_words != wb.question_words),
        len(wa.stem_set & wb.stem_set) / max(len(union), 1),
        max(side_a.deficit, side_b.deficit),
        len(wa.instructions ^ wb.instructions),
        *(float(conflict(pa, pb, check) is not None) for check in _EVIDENCE_CHECKS),
    ]  # fmt: skip
    return np.asarray(values, dtype=np.float32)


_EVIDENCE_CHECKS = tuple(frozenset({check}) for check in ("swap", "antonym", "time"))


@dataclass(frozen=True)
class _Side:
    worst: float
    mean: float
    weak: int
    unmatched: int
    names: int
    deficit: float


def _side(best: np.ndarray, content: np.ndarray, matched: np.ndarray, names: np.ndarray) -> _Side:
    """One question's side: `best` similarity of each word's best counterpart, `matched` whether its
    stem occurs opposite."""
    scores = best[content] if content.any() else np.ones(1, dtype=np.float32)
    return _Side(
        float(scores.min()), float(scores.mean()), int((scores < 0.6).sum()),
        int(np.count_nonzero(content & ~matched)), int(np.count_nonzero(names & ~matched & (best < 0.8))),
        float((1 - scores).sum()),
    )  # fmt: skip


def _content(stems: Sequence[str]) -> np.ndarray:
    return np.array([s not in FUNCTION_WORDS and not s.isdigit() for s in stems], dtype=bool)


def _worst_shared(sims: np.ndarray, same: np.ndarray, content_a: np.ndarray) -> float:
    """Lowest contextual similarity between occurrences of one content word on both sides (a word of
    the first question against the last occurrence of its stem in the second)."""
    rows = np.flatnonzero(content_a & same.any(axis=1))
    if not len(rows):
        return 1.0
    last = same.shape[1] - 1 - np.argmax(same[rows, ::-1], axis=1)
    return min(1.0, float(sims[rows, last].min()))


def _discordance(same: np.ndarray, wa: Words, wb: Words) -> float:
    """Share of pairs of shared content words that appear in the other order."""
    once = same & wb.once[None, :]  # each row: at most one column, the stem being once in b
    rows = np.flatnonzero(wa.content & wa.once & once.any(axis=1))
    pairs = len(rows) * (len(rows) - 1) / 2
    if not pairs:
        return 0.0
    order = np.argmax(once[rows], axis=1)
    return int(np.count_nonzero(np.triu(order[:, None] > order[None, :], 1))) / pairs


def _negations(stems: Sequence[str]) -> int:
    return sum(1 for s in stems if s in NEGATIONS or s == "t" or s.endswith("n't"))


def _instructions(stems: Sequence[str]) -> set[str]:
    return {s for s in stems if s in INSTRUCTION_WORDS}


def _question_words(stems: Sequence[str]) -> frozenset[str]:
    return frozenset(s for s in stems if s in _QUESTION_WORDS)
