"""Choosing the router by cross-task validation: every candidate is trained on some tasks and scored on
another one it never saw; the candidate with the best mean held-out APGR wins.

Tasks here are the four MMLU subject groups (bench/routellm_tasks.py). `logo_scores` trains every
candidate on three groups and scores it on the fourth; `choose` picks the best mean held-out APGR,
over all four groups for the shipped router, over the other three when a group's own figure is reported.
MT-Bench is never used for any choice here.
"""

from dataclasses import dataclass

import numpy as np
from sklearn.decomposition import PCA

from bench.routing_curves import routing_curve
from bench.train_router import fit
from routing.features import TEXT_FEATURES
from routing.learned import GainModel, LogisticModel, TextRouter


@dataclass(frozen=True)
class Candidate:
    text: str  # which text features of routing/features.py: "all", "length" (length and structure), "off"
    embedding: str  # "none" | "pca" | "full" (MiniLM)
    k: int  # PCA components when embedding == "pca"
    head: str  # "weak": P(weak correct); "gain": P(weak) − P(strong); "fixed": longer = stronger, nothing fitted
    c: float  # inverse L2 strength

    @property
    def name(self) -> str:
        parts = ([] if self.text == "off" else [f"text:{self.text}"]) + (
            [] if self.embedding == "none" else [f"pca{self.k}" if self.embedding == "pca" else "minilm"]
        )
        if self.head == "fixed":
            return "length heuristic (log chars, unfitted)"
        return f"{'+'.join(parts)} {self.head} C={self.c:g}"


_LENGTH = ("log_chars", "log_words", "log_lines", "log_sentences")
_MARKERS = ("log_chars", "log_numbers", "log_math_symbols", "log_code_markers", "log_reasoning_words",
            "log_question_marks", "log_creative_words", "log_explain_words")  # fmt: skip
# Multiple-choice structure (routing/features.py), alone beside length or added to the markers:
_LEN_PARTS = ("log_chars", "log_parts")
_STRUCTURE = ("log_chars", "log_sentences", "log_parts", "log_negation", "catch_all_option")
_OPTIONS = (*_STRUCTURE, "log_option_chars", "numeric_option_share")


def _columns(names: tuple[str, ...]) -> np.ndarray:
    return np.array([TEXT_FEATURES.index(n) for n in names])


TEXT_SETS = {
    "markers": _columns(_MARKERS),
    "len_parts": _columns(_LEN_PARTS),
    "len_parts_sent": _columns(_LEN_PARTS + ("log_sentences",)),
    "structure": _columns(_STRUCTURE),
    "options": _columns(_OPTIONS),
    "markers_parts": _columns(_MARKERS + ("log_parts",)),
    "all": np.arange(len(TEXT_FEATURES)),
    "length": _columns(_LENGTH),
    "off": np.zeros(0, int),
    "chars": _columns(("log_chars",)),
}
_STRUCTURE_SETS = ("len_parts", "len_parts_sent", "structure", "options", "markers_parts")
LENGTH_HEURISTIC = Candidate("chars", "none", 0, "fixed", 0.0)
CANDIDATES = [
    *(Candidate("all", "none", 0, head, c) for head in ("weak", "gain") for c in (0.01, 1.0)),
    *(Candidate("all", "pca", 16, "gain", c) for c in (0.01, 1.0)),
    Candidate("all", "pca", 16, "weak", 0.1),
    Candidate("all", "full", 0, "gain", 0.1),
    Candidate("off", "full", 0, "gain", 0.1),  # the embedding-only router shipped before
    *(Candidate("length", "none", 0, head, 1.0) for head in ("weak", "gain")),
    *(Candidate("markers", "none", 0, head, 0.1) for head in ("weak", "gain")),
    Candidate("length", "pca", 16, "gain", 0.01),
    Candidate("markers", "pca", 8, "gain", 0.1),
    LENGTH_HEURISTIC,
]
# Without the MiniLM embeddings of the 14k MMLU prompts (~25 CPU-minutes to compute once):
TEXT_CANDIDATES = [
    *(
        Candidate(t, "none", 0, head, c)
        for t in ("all", "length", "markers", *_STRUCTURE_SETS)
        for head in ("weak", "gain")
        for c in (0.01, 0.1, 1.0)
    ),
    LENGTH_HEURISTIC,
]


@dataclass
class TaskData:
    """Everything a router is trained or scored on: text features, embeddings, both models' quality."""

    text: np.ndarray
    emb: np.ndarray
    weak: np.ndarray
    strong: np.ndarray
    group: np.ndarray

    def take(self, mask: np.ndarray) -> "TaskData":
        return TaskData(self.text[mask], self.emb[mask], self.weak[mask], self.strong[mask], self.group[mask])


def train_candidate(candidate: Candidate, data: TaskData) -> TextRouter:
    """Fit the PCA (if any) and the head on binary correctness labels."""
    dim = data.emb.shape[1]
    center, components = data.emb.mean(axis=0), np.zeros((0, 0), np.float32)
    if candidate.embedding == "pca":
        components = PCA(candidate.k, random_state=0).fit(data.emb).components_.T
    router = TextRouter(
        TEXT_SETS[candidate.text], candidate.embedding, center[:dim], components, _placeholder()
    )
    x = router.design(data.text, data.emb)
    if candidate.head == "fixed":  # P(weak good) falls with length: sigmoid(−standardised log length)
        router.head = LogisticModel(-np.ones(1), 0.0, x.mean(axis=0), x.std(axis=0) + 1e-6, False)
        return router
    weak = fit(x, data.weak, candidate.c, False)
    router.head = (
        weak if candidate.head == "weak" else GainModel(weak, fit(x, data.strong, candidate.c, False))
    )
    return router


def strong_need(router: TextRouter, data: TaskData) -> np.ndarray:
    """Higher = send to the strong model (the negated confidence)."""
    return -router.head.confidence(router.design(data.text, data.emb))


def heldout_apgr(candidate: Candidate, data: TaskData, group: str) -> float:
    held = data.group == group
    router = train_candidate(candidate, data.take(~held))
    test = data.take(held)
    return routing_curve(strong_need(router, test), test.weak, test.strong).apgr()


HeldOut = dict[str, dict[str, np.ndarray]]  # candidate name → group → scores from a model trained without it


def logo_scores(data: TaskData, candidates: list[Candidate] = CANDIDATES) -> HeldOut:
    """Leave-one-group-out: every candidate trained on all groups but one, scored on that one."""
    groups = sorted(set(data.group.tolist()))
    result: HeldOut = {}
    for candidate in candidates:
        result[candidate.name] = {}
        for group in groups:
            held = data.group == group
            router = train_candidate(candidate, data.take(~held))
            result[candidate.name][group] = strong_need(router, data.take(held))
    return result


def group_apgr(heldout: HeldOut, data: TaskData) -> dict[str, dict[str, float]]:
    """candidate name → group → held-out APGR."""
    apgr = {}
    for name, per_group in heldout.items():
        apgr[name] = {}
        for group, need in per_group.items():
            held = data.group == group
            apgr[name][group] = routing_curve(need, data.weak[held], data.strong[held]).apgr()
    return apgr


def choose(apgr: dict[str, dict[str, float]], leave_out: str | None = None) -> str:
    """The candidate with the best mean held-out APGR over the groups other than `leave_out`."""
    return max(apgr, key=lambda name: np.mean([v for g, v in apgr[name].items() if g != leave_out]))


def select(data: TaskData, candidates: list[Candidate] = CANDIDATES) -> tuple[Candidate, dict[str, float]]:
    """Leave-one-group-out over the groups present; the best mean held-out APGR wins."""
    apgr = group_apgr(logo_scores(data, candidates), data)
    best = choose(apgr)
    return next(c for c in candidates if c.name == best), {
        n: float(np.mean(list(v.values()))) for n, v in apgr.items()
    }


def _placeholder() -> LogisticModel:
    empty = np.zeros(0, np.float32)
    return LogisticModel(empty, 0.0, empty, empty, False)
