"""Choosing the router by cross-task validation: every candidate is trained on some tasks and scored on
another one it never saw; the candidate with the best mean held-out APGR wins.

Tasks here are the four MMLU subject groups (bench/routellm_tasks.py). `select` runs leave-one-group-out
over the groups it is given; `nested_heldout` wraps it so that the reported score of each group comes
from a router selected and trained without that group. MT-Bench is never used for any choice here.
"""

from dataclasses import dataclass

import numpy as np
from sklearn.decomposition import PCA

from bench.routing_curves import routing_curve
from bench.train_router import fit
from routing.learned import GainModel, LogisticModel, TextRouter


@dataclass(frozen=True)
class Candidate:
    use_text: bool  # the text features of routing/features.py
    embedding: str  # "none" | "pca" | "full" (MiniLM)
    k: int  # PCA components when embedding == "pca"
    head: str  # "weak": P(weak correct); "gain": P(weak correct) − P(strong correct)
    c: float  # inverse L2 strength

    @property
    def name(self) -> str:
        parts = (["text"] if self.use_text else []) + (
            [] if self.embedding == "none" else [f"pca{self.k}" if self.embedding == "pca" else "minilm"]
        )
        return f"{'+'.join(parts)} {self.head} C={self.c:g}"


CANDIDATES = [
    *(Candidate(True, emb, k, head, c) for emb, k in [("none", 0), ("pca", 16)] for head in ("weak", "gain")
      for c in (0.01, 1.0)),
    *(Candidate(True, "full", 0, "gain", c) for c in (0.01, 0.1)),
    Candidate(False, "full", 0, "gain", 0.1),  # the embedding-only router shipped before
]  # fmt: skip


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
    router = TextRouter(candidate.use_text, candidate.embedding, center[:dim], components, _placeholder())
    x = router.design(data.text, data.emb)
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


def select(data: TaskData, candidates: list[Candidate] = CANDIDATES) -> tuple[Candidate, dict[str, float]]:
    """Leave-one-group-out over the groups present; the best mean held-out APGR wins."""
    groups = sorted(set(data.group.tolist()))
    scores = {c.name: float(np.mean([heldout_apgr(c, data, g) for g in groups])) for c in candidates}
    best = max(candidates, key=lambda c: scores[c.name])
    return best, scores


def nested_heldout(data: TaskData) -> dict[str, tuple[Candidate, np.ndarray]]:
    """Per group: the candidate chosen without it, and that router's scores on the group."""
    result = {}
    for group in sorted(set(data.group.tolist())):
        held = data.group == group
        chosen, _ = select(data.take(~held))
        router = train_candidate(chosen, data.take(~held))
        result[group] = (chosen, strong_need(router, data.take(held)))
    return result


def _placeholder() -> LogisticModel:
    empty = np.zeros(0, np.float32)
    return LogisticModel(empty, 0.0, empty, empty, False)
