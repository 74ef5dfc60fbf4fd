"""Logistic regression at serving time in numpy: standardised features → P(small model is good enough).

Trained by bench/train_router.py (scikit-learn at training time only); stored as a small .npz.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

LOGPROB_FEATURES = ("mean", "min", "min_window4", "share_below_minus1", "log_length")


def logprob_features(logprobs: list[float]) -> np.ndarray:
    if not logprobs:
        return np.array([-10.0, -10.0, -10.0, 1.0, 0.0], dtype=np.float32)
    values = np.asarray(logprobs, dtype=np.float64)
    window = min(4, len(values))
    windows = np.convolve(values, np.ones(window), mode="valid") / window
    stats = [values.mean(), values.min(), windows.min(), (values < -1.0).mean(), np.log1p(len(values))]
    return np.array(stats, dtype=np.float32)


@dataclass
class LogisticModel:
    weights: np.ndarray  # (d,)
    bias: float
    mean: np.ndarray  # (d,) feature standardisation
    scale: np.ndarray
    uses_logprobs: bool

    def predict(self, embeddings: np.ndarray, logprob_stats: np.ndarray | None = None) -> np.ndarray:
        features = embeddings if logprob_stats is None else np.hstack([embeddings, logprob_stats])
        z = ((features - self.mean) / self.scale) @ self.weights + self.bias
        return 1.0 / (1.0 + np.exp(-z))

    def save(self, path: Path) -> None:
        np.savez_compressed(path, weights=self.weights.astype(np.float32), bias=np.float64(self.bias),
                            mean=self.mean.astype(np.float32), scale=self.scale.astype(np.float32),
                            uses_logprobs=np.bool_(self.uses_logprobs))  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> "LogisticModel":
        with np.load(path) as data:
            return cls(
                data["weights"], float(data["bias"]), data["mean"], data["scale"], bool(data["uses_logprobs"])
            )
