"""Choosing the router by cross-task validation: every candidate is trained on some tasks and scored on
another one it never saw; the candidate that beats the length heuristic by most on its worst task wins.

Tasks here are the four MMLU subject groups (bench/lib/routellm_data.py) and MT-Bench. `logo_scores` trains
every candidate on three groups and scores it on the fourth; `add_unseen_scores` trains it on all of MMLU
and scores it on MT-Bench. `choose` picks on every task but the one reported: by the mean over the MMLU
groups ("mean", MT-Bench takes no part), or maximin against the length heuristic over the MMLU groups
and MT-Bench ("maximin"; MT-Bench's own figure is then chosen on the four MMLU groups only).
"""

from dataclasses import dataclass

import numpy as np
from sklearn.decomposition import PCA

from bench.lib.cascade_common import fit, fit_within_subject
from bench.lib.routing_curves import routing_curve
from routing.features import MULTIPLE_CHOICE_FEATURES, TEXT_FEATURES
from routing.learned import GainModel, LogisticModel, TextRouter


@dataclass(frozen=True)
class Candidate:
    text: str  # which text features of routing/features.py: "all", "length" (length and structure), "off"
    embedding: str  # "none" | "pca" | "full" (MiniLM)
    k: int  # PCA components when embedding == "pca"
    head: str  # "weak": P(weak correct); "gain": P(weak) − P(strong); "fixed": longer = stronger, nothing fitted;
    # "within": the strong − weak gain fitted within subjects (cascade_common.fit_within_subject)
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
    "all_mc": np.arange(len(TEXT_FEATURES)),  # every feature, the multiple-choice ones included
    "all": _columns(tuple(n for n in TEXT_FEATURES if n not in MULTIPLE_CHOICE_FEATURES)),
    "length": _columns(_LENGTH),
    "off": np.zeros(0, int),
    "chars": _columns(("log_chars",)),
}
_STRUCTURE_SETS = ("len_parts", "len_parts_sent", "structure", "options", "markers_parts", "all_mc")
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
        for head in ("weak", "gain", "within")
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
    subject: np.ndarray | None = None  # finer than group (MMLU subject), for the "within" head

    def take(self, mask: np.ndarray) -> "TaskData":
        subject = None if self.subject is None else self.subject[mask]
        return TaskData(
            self.text[mask], self.emb[mask], self.weak[mask], self.strong[mask], self.group[mask], subject
        )


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
    if candidate.head == "within":
        router.head = fit_within_subject(x, data.weak, data.strong, _subjects(data), candidate.c)
        return router
    weak = fit(x, data.weak, candidate.c, False)
    router.head = (
        weak if candidate.head == "weak" else GainModel(weak, fit(x, data.strong, candidate.c, False))
    )
    return router


def _subjects(data: TaskData) -> np.ndarray:
    return data.group if data.subject is None else data.subject


def strong_need(router: TextRouter, data: TaskData) -> np.ndarray:
    """Higher = send to the strong model (the negated confidence)."""
    return -router.head.confidence(router.design(data.text, data.emb))


def heldout_apgr(candidate: Candidate, data: TaskData, group: str) -> float:
    held = data.group == group
    router = train_candidate(candidate, data.take(~held))
    test = data.take(held)
    return routing_curve(strong_need(router, test), test.weak, test.strong).apgr()


HeldOut = dict[str, dict[str, np.ndarray]]  # candidate name → task → scores from a model trained without it
UNSEEN = "mt_bench"  # the task key of the other task (trained on MMLU only) beside the MMLU groups


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


def add_unseen_scores(heldout: HeldOut, data: TaskData, other: TaskData, candidates: list[Candidate]) -> None:
    """Every candidate trained on all of `data` (MMLU), scored on the other task under the key UNSEEN."""
    for candidate in candidates:
        heldout[candidate.name][UNSEEN] = strong_need(train_candidate(candidate, data), other)


def task_sets(data: TaskData, other: TaskData | None = None) -> dict[str, TaskData]:
    """task key → its questions: one per MMLU group, and UNSEEN for the other task when given."""
    tasks = {g: data.take(data.group == g) for g in sorted(set(data.group.tolist()))}
    return tasks if other is None else {**tasks, UNSEEN: other}


def group_apgr(
    heldout: HeldOut, data: TaskData, other: TaskData | None = None
) -> dict[str, dict[str, float]]:
    """candidate name → task (MMLU group, or UNSEEN) → held-out APGR."""
    tasks = task_sets(data, other)
    return {
        name: {t: routing_curve(need, tasks[t].weak, tasks[t].strong).apgr() for t, need in per_task.items()}
        for name, per_task in heldout.items()
    }


RULES = ("mean", "maximin")


def choose(apgr: dict[str, dict[str, float]], leave_out: str | None = None, rule: str = "mean") -> str:
    """The candidate chosen on every task but `leave_out`.

    mean: the best mean held-out APGR over the MMLU groups only (UNSEEN takes no part), as before.
    maximin: against the length heuristic (the target: beat it on every unseen task) over all tasks
    including UNSEEN: the largest smallest margin over it, ties by the mean APGR. The length heuristic
    has margin 0, so it wins unless something beats it everywhere; without it the margin is the APGR."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}")
    base = apgr.get(LENGTH_HEURISTIC.name, {})

    def key(name: str) -> tuple[float, float]:
        tasks = [t for t in apgr[name] if t != leave_out and (rule == "maximin" or t != UNSEEN)]
        mean = float(np.mean([apgr[name][t] for t in tasks]))
        if rule == "mean":
            return mean, 0.0
        return round(min(apgr[name][t] - base.get(t, 0.0) for t in tasks), 6), mean

    return max(apgr, key=key)


def select(data: TaskData, candidates: list[Candidate] = CANDIDATES) -> tuple[Candidate, dict[str, float]]:
    """Leave-one-group-out over the groups present, chosen by `choose`; also every candidate's mean."""
    apgr = group_apgr(logo_scores(data, candidates), data)
    best = choose(apgr)
    return next(c for c in candidates if c.name == best), {
        n: float(np.mean(list(v.values()))) for n, v in apgr.items()
    }


def _placeholder() -> LogisticModel:
    empty = np.zeros(0, np.float32)
    return LogisticModel(empty, 0.0, empty, empty, False)
