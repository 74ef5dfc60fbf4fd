"""The learned check on every semantic candidate: may the answer cached for the stored question be served
for the new one? A small MLP (trained by bench/train_verifier.py, weights in cache/verifier_model/) reads
the word alignment of the two questions (cache/alignment.py) and gives a probability; a hit needs it to
reach the threshold that the shipped calibration table gives for the policy's precision target. One rule
stays because it is exact: questions with different numbers never share an answer.

Inference is a few hundred multiply-adds in numpy: well under a millisecond per candidate."""

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


class Verifier:
    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], mean: np.ndarray, scale: np.ndarray,
                 calibration: list[CalibrationPoint], candidate_threshold: float) -> None:  # fmt: skip
        self._layers, self._mean, self._scale = layers, mean, scale
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
        layers = [(weights[f"w{i}"], weights[f"b{i}"]) for i in range(meta["layers"])]
        points = [CalibrationPoint(**p) for p in meta["calibration"]]
        return cls(layers, weights["mean"], weights["scale"], points, float(meta["candidate_threshold"]))

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
        h = (features - self._mean) / self._scale
        for i, (w, b) in enumerate(self._layers):
            h = h @ w + b
            if i < len(self._layers) - 1:
                h = np.maximum(h, 0.0)
        return 1.0 / (1.0 + np.exp(-h[:, 0]))

    def judge(self, stored: EncodedQuestion, new: EncodedQuestion, threshold: float) -> Verdict:
        if conflict(parse(stored.text), parse(new.text), _NUMBERS):
            return Verdict(False, 0.0)
        probability = float(self.probabilities(pair_features(stored, new)[None, :])[0])
        return Verdict(probability >= threshold, probability)


def load_verifier(folder: Path = MODEL_DIR) -> Verifier | None:
    """None (and a warning) when the weights are missing or unreadable: semantic caching then stays off."""
    try:
        return Verifier.load(folder)
    except (OSError, ValueError, KeyError) as error:
        log.warning("semantic cache off: verifier weights unavailable in %s (%s)", folder, error)
        return None
