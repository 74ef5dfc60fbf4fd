"""The semantic cache's word vectors, pair features and relation-swap check as they were computed before
they were made faster (cache/encoder.py, cache/alignment.py and cache/guard.py at b63b9be): plain
per-word loops, kept only so that tests/test_cache_fast_paths.py can pin the fast code to them. Not used
by the gateway."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cache.alignment import words_of
from cache.encoder import EncodedQuestion, _unit, _unit_rows
from cache.guard import Question, conflict
from cache.lexicon import RELATION_WORDS


def question(text: str, encoding: Any, hidden: np.ndarray) -> EncodedQuestion:
    pooled = hidden.mean(axis=0)
    groups: dict[int, list[int]] = {}
    for position, word in enumerate(encoding.word_ids):
        if word is not None:
            groups.setdefault(word, []).append(position)
    words, vectors = [], []
    for positions in groups.values():
        start, end = encoding.offsets[positions[0]][0], encoding.offsets[positions[-1]][1]
        surface = text[start:end]
        if any(c.isalnum() for c in surface):
            words.append(surface)
            vectors.append(hidden[positions].mean(axis=0))
    matrix = np.asarray(vectors, dtype=np.float32).reshape(-1, hidden.shape[1])
    return EncodedQuestion(text, _unit(pooled), tuple(words), _unit_rows(matrix))


def pair_features(a: EncodedQuestion, b: EncodedQuestion) -> np.ndarray:
    sims = (
        a.word_vectors @ b.word_vectors.T
        if len(a.words) and len(b.words)
        else np.zeros((len(a.words), len(b.words)))
    )
    best_a = sims.max(axis=1) if sims.size else np.zeros(len(a.words))
    best_b = sims.max(axis=0) if sims.size else np.zeros(len(b.words))
    wa, wb = words_of(a.text, a.words), words_of(b.text, b.words)
    stems_a, stems_b, content_a = wa.stems, wb.stems, wa.content
    side_a = _side(best_a, content_a, stems_a, wb.stem_set, a.words)
    side_b = _side(best_b, wb.content, stems_b, wa.stem_set, b.words)
    pa, pb = wa.parsed, wb.parsed
    union = wa.stem_set | wb.stem_set
    values = [
        float(a.vector @ b.vector),
        min(side_a.worst, side_b.worst), max(side_a.worst, side_b.worst),
        min(side_a.mean, side_b.mean), max(side_a.mean, side_b.mean),
        max(side_a.weak, side_b.weak), min(side_a.weak, side_b.weak),
        max(side_a.unmatched, side_b.unmatched), min(side_a.unmatched, side_b.unmatched),
        side_a.names + side_b.names,
        _worst_shared(sims, stems_a, stems_b, content_a),
        _discordance(stems_a, stems_b, content_a),
        min(len(a.words), len(b.words)) / max(len(a.words), len(b.words), 1),
        max(len(a.words), len(b.words)) / 20,
        float(wa.negations != wb.negations),
        float(sorted(pa.units) != sorted(pb.units)),
        float(wa.question_words != wb.question_words),
        len(wa.stem_set & wb.stem_set) / max(len(union), 1),
        max(side_a.deficit, side_b.deficit),
        len(wa.instructions ^ wb.instructions),
        *(float(conflict(pa, pb, frozenset({check})) is not None) for check in ("swap", "antonym", "time")),
    ]  # fmt: skip
    return np.asarray(values, dtype=np.float32)


@dataclass(frozen=True)
class _Side:
    worst: float
    mean: float
    weak: int
    unmatched: int
    names: int
    deficit: float


def _side(
    best: np.ndarray, content: np.ndarray, stems: Sequence[str], other: frozenset[str], words: tuple[str, ...]
) -> _Side:
    scores = best[content] if content.any() else np.ones(1, dtype=np.float32)
    unmatched = sum(1 for i in np.flatnonzero(content) if stems[i] not in other)
    names = sum(
        1
        for i, w in enumerate(words)
        if i > 0 and w[:1].isupper() and stems[i] not in other and best[i] < 0.8
    )
    return _Side(
        float(scores.min()), float(scores.mean()), int((scores < 0.6).sum()), unmatched, names,
        float((1 - scores).sum()),
    )  # fmt: skip


def _worst_shared(
    sims: np.ndarray, stems_a: Sequence[str], stems_b: Sequence[str], content_a: np.ndarray
) -> float:
    worst = 1.0
    positions_b = {s: j for j, s in enumerate(stems_b)}
    for i, s in enumerate(stems_a):
        if content_a[i] and s in positions_b:
            worst = min(worst, float(sims[i, positions_b[s]]))
    return worst


def _discordance(stems_a: Sequence[str], stems_b: Sequence[str], content_a: np.ndarray) -> float:
    once_b = {s: j for j, s in enumerate(stems_b) if stems_b.count(s) == 1}
    order = [
        once_b[s] for i, s in enumerate(stems_a) if content_a[i] and s in once_b and stems_a.count(s) == 1
    ]
    pairs = len(order) * (len(order) - 1) / 2
    if not pairs:
        return 0.0
    flipped = sum(1 for i in range(len(order)) for j in range(i + 1, len(order)) if order[i] > order[j])
    return flipped / pairs


def swapped_around_relation(a: Question, b: Question) -> bool:
    shared = set(a.content) & set(b.content)
    for relation in RELATION_WORDS:
        sides_a, sides_b = (
            _relation_sides(a.words, relation, shared),
            _relation_sides(b.words, relation, shared),
        )
        if sides_a and sides_b and sides_a != sides_b:
            return True
    return False


def _relation_sides(words: tuple[str, ...], relation: str, shared: set[str]) -> frozenset[str] | None:
    if words.count(relation) != 1:
        return None
    at = words.index(relation)
    before = frozenset(w for w in words[:at] if w in shared)
    after = frozenset(w for w in words[at + 1 :] if w in shared)
    return before if before and after else None
