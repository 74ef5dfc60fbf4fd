"""The learned check on every semantic candidate: may the answer cached for the stored question be served
for the new one? Gradient-boosted trees (trained by bench/train_verifier.py with scikit-learn, chosen over
an MLP and logistic regression for recall at the target precision on the calibration split; exported to
plain arrays in cache/verifier_model/) read the word alignment of the two questions (cache/alignment.py)
and give a probability; a hit needs it to reach the threshold that the shipped calibration table gives
for the policy's precision target. One rule stays because it is exact: questions with different numbers
never share an answer.

Inference walks all trees at once in numpy (one step per tree level), so scikit-learn is not needed at
run time: tens of microseconds per candidate."""

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.alignment import FEATURES, pair_features
from cache.encoder import EncodedQuestion
from cache.guard import conflict, parse

log = logging.getLogger("llmgw.cache")
MODEL_DIR = Path(__file__).parent / "verifier_model"
_NUMBERS = frozenset({"number"})


@dataclass(frozen=True)
class CalibrationPoint:
    threshold: float
    precision: float
    recall: float


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    probability: float


@dataclass(frozen=True)
class Trees:
    """Boosted trees as arrays (trees × nodes): split feature and threshold, children, leaf values."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    missing_left: np.ndarray
    leaf: np.ndarray
    value: np.ndarray
    baseline: float
    depth: int

    def raw(self, x: np.ndarray) -> np.ndarray:
        """Summed leaf values for each row of x (rows × features)."""
        rows, trees = np.arange(x.shape[0])[:, None], np.arange(self.feature.shape[0])[None, :]
        node = np.zeros((x.shape[0], self.feature.shape[0]), dtype=np.int64)
        for _ in range(self.depth):
            values = x[rows, self.feature[trees, node]]
            go_left = np.where(
                np.isnan(values), self.missing_left[trees, node], values <= self.threshold[trees, node]
            )
            step = np.where(go_left, self.left[trees, node], self.right[trees, node])
            node = np.where(self.leaf[trees, node], node, step)
        return self.baseline + self.value[trees, node].sum(axis=1)


class Verifier:
    def __init__(self, trees: Trees, calibration: list[CalibrationPoint], candidate_threshold: float) -> None:
        self._trees = trees
        self.calibration = sorted(calibration, key=lambda p: p.threshold)
        self.candidate_threshold = candidate_threshold

    @classmethod
    def load(cls, folder: Path = MODEL_DIR) -> "Verifier":
        weights = np.load(folder / "verifier.npz")
        meta = json.loads((folder / "verifier.json").read_text())
        if tuple(meta["features"]) != FEATURES:
            raise ValueError(
                "verifier weights were trained on other features; re-run bench/train_verifier.py"
            )
        names = ("feature", "threshold", "left", "right", "missing_left", "leaf", "value")
        trees = Trees(
            *(weights[n] for n in names), baseline=float(meta["baseline"]), depth=int(meta["depth"])
        )
        points = [CalibrationPoint(**p) for p in meta["calibration"]]
        return cls(trees, points, float(meta["candidate_threshold"]))

    def threshold_for(self, min_precision: float) -> float:
        """The lowest probability threshold whose calibration precision reaches the target (and stays
        there for every stricter threshold); 1.01 (nothing passes) when none does."""
        passing = 1.01
        for point in reversed(self.calibration):
            if point.precision < min_precision:
                break
            passing = point.threshold
        return passing

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self._trees.raw(features.astype(np.float64))))

    def judge(self, stored: EncodedQuestion, new: EncodedQuestion, threshold: float) -> Verdict:
        return self.judge_all([stored], new, threshold)[0]

    def judge_all(
        self, stored: list[EncodedQuestion], new: EncodedQuestion, threshold: float
    ) -> list[Verdict]:
        """One verdict per stored question, the trees walked once for all of them."""
        if not stored:
            return []
        probabilities = self.probabilities(np.stack([pair_features(s, new) for s in stored]))
        parsed = parse(new.text)
        return [
            Verdict(False, 0.0)
            if conflict(parse(s.text), parsed, _NUMBERS)
            else Verdict(p >= threshold, float(p))
            for s, p in zip(stored, probabilities, strict=True)
        ]


def load_verifier(folder: Path = MODEL_DIR) -> Verifier | None:
    """None (and a warning) when the weights are missing or unreadable: semantic caching then stays off."""
    try:
        return Verifier.load(folder)
    except (OSError, ValueError, KeyError) as error:
        log.warning("semantic cache off: verifier weights unavailable in %s (%s)", folder, error)
        return None
