"""Logistic regression at serving time in numpy: standardised features → P(small model is good enough).

Trained by bench/train_router.py (scikit-learn at training time only); stored as a small .npz.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    def confidence(self, embeddings: np.ndarray, logprob_stats: np.ndarray | None = None) -> np.ndarray:
        """P(the small model's answer is good)."""
        return self.predict(embeddings, logprob_stats)

    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        return {prefix + "weights": self.weights.astype(np.float32), prefix + "bias": np.float64(self.bias),
                prefix + "mean": self.mean.astype(np.float32), prefix + "scale": self.scale.astype(np.float32),
                prefix + "uses_logprobs": np.bool_(self.uses_logprobs)}  # fmt: skip

    @classmethod
    def from_arrays(cls, data: Any, prefix: str = "") -> "LogisticModel":
        return cls(data[prefix + "weights"], float(data[prefix + "bias"]), data[prefix + "mean"],
                   data[prefix + "scale"], bool(data[prefix + "uses_logprobs"]))  # fmt: skip

    def save(self, path: Path) -> None:
        np.savez_compressed(path, **self.arrays())


@dataclass
class GainModel:
    """Two logistic models, P(small correct) and P(large correct); confidence = P(small) − P(large).

    Ranking by the expected gain of escalating beats ranking by P(small correct) alone: it does not
    escalate questions that the large model is as likely to miss.
    """

    small: LogisticModel
    large: LogisticModel
    uses_logprobs: bool = False

    def confidence(self, embeddings: np.ndarray, logprob_stats: np.ndarray | None = None) -> np.ndarray:
        return self.small.predict(embeddings) - self.large.predict(embeddings)

    def save(self, path: Path) -> None:
        np.savez_compressed(path, **self.small.arrays("small_"), **self.large.arrays("large_"))


def load_model(path: Path) -> LogisticModel | GainModel:
    with np.load(path) as data:
        if "small_weights" in data:
            return GainModel(
                LogisticModel.from_arrays(data, "small_"), LogisticModel.from_arrays(data, "large_")
            )
        return LogisticModel.from_arrays(data)
