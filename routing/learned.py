"""Logistic regression at serving time in numpy: standardised features → P(small model is good enough).

Trained by training/train_router.py (scikit-learn at training time only); stored as a small .npz.
TextRouter is the shipped question-only router: text features (routing/features.py) plus the MiniLM
embedding, reduced by a PCA projection or left out, in front of a LogisticModel or a GainModel.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from routing.features import text_features

LOGPROB_FEATURES = ("mean", "min", "min_window4", "share_below_minus1", "log_length")
ANSWER_FEATURES = ("mean", "min", "first", "first_margin", "mean_margin", "log_length", "log_question_chars")


def logprob_features(logprobs: list[float]) -> np.ndarray:
    if not logprobs:
        return np.array([-10.0, -10.0, -10.0, 1.0, 0.0], dtype=np.float32)
    values = np.asarray(logprobs, dtype=np.float64)
    window = min(4, len(values))
    windows = np.convolve(values, np.ones(window), mode="valid") / window
    stats = [values.mean(), values.min(), windows.min(), (values < -1.0).mean(), np.log1p(len(values))]
    return np.array(stats, dtype=np.float32)


def answer_features(question: str, logprobs: list[float], margins: list[float]) -> np.ndarray:
    """The small answer's own signals, none tied to a task's vocabulary: mean/min token logprob, the first
    (answer) token's logprob and its top-1 − top-2 margin, the mean margin, answer and question length."""
    if not logprobs:
        return np.array([-10.0, -10.0, -10.0, 0.0, 0.0, 0.0, np.log1p(len(question))], dtype=np.float32)
    values = np.asarray(logprobs, dtype=np.float64)
    first_margin = margins[0] if margins else 0.0
    mean_margin = float(np.mean(margins)) if margins else 0.0
    stats = [values.mean(), values.min(), values[0], first_margin, mean_margin, np.log1p(len(values)),
             np.log1p(len(question))]  # fmt: skip
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
class AnswerModel:
    """The cascade confidence: a LogisticModel on answer_features → P(the small answer is correct).

    Needs no embedding, only the small answer's logprobs with top-2 alternatives (top_logprobs=2). `columns`:
    the answer_features it reads, by name (stored in the file; files without them read all seven).
    """

    head: LogisticModel
    uses_logprobs: bool = True
    columns: tuple[str, ...] = ANSWER_FEATURES

    def __post_init__(self) -> None:
        unknown = set(self.columns) - set(ANSWER_FEATURES)
        if unknown or len(self.columns) != len(self.head.weights):
            raise ValueError(
                f"answer model columns {self.columns} do not fit its {len(self.head.weights)} weights"
            )
        self._index = [ANSWER_FEATURES.index(name) for name in self.columns]

    def confidence(self, question: str, logprobs: list[float], margins: list[float]) -> float:
        features = answer_features(question, logprobs, margins)[self._index]
        return float(self.head.predict(features[None, :])[0])

    def save(self, path: Path) -> None:
        np.savez_compressed(
            path, features=np.str_("answer"), answer_columns=np.array(self.columns), **self.head.arrays()
        )


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

    def arrays(self) -> dict[str, np.ndarray]:
        return {**self.small.arrays("small_"), **self.large.arrays("large_")}

    def save(self, path: Path) -> None:
        np.savez_compressed(path, **self.arrays())


@dataclass
class TextRouter:
    """A router on the question alone: [text features | embedding projected on `components`] → head.

    text_columns: which TEXT_FEATURES are used (indices; empty = none). embedding: "none" (no embedding), "pca" (centred, projected on the k columns of
    `components`) or "full" (the whole embedding). Confidence: the head's, higher = keep the small model.
    """

    text_columns: np.ndarray  # int indices into routing.features.TEXT_FEATURES
    embedding: str
    center: np.ndarray  # (dim,) embedding mean, used by "pca"
    components: np.ndarray  # (dim, k) for "pca"; (0, 0) otherwise
    head: LogisticModel | GainModel
    uses_logprobs: bool = False
    needs_text: bool = True

    def features(self, texts: list[str], embeddings: np.ndarray) -> np.ndarray:
        return self.design(text_features(texts), embeddings)

    def design(self, text_stats: np.ndarray, embeddings: np.ndarray) -> np.ndarray:
        """The head's input from precomputed text features and embeddings."""
        parts = [text_stats[:, self.text_columns.astype(int)]]
        if self.embedding == "pca":
            parts.append((embeddings - self.center) @ self.components)
        elif self.embedding == "full":
            parts.append(embeddings)
        return np.hstack(parts).astype(np.float64)

    def confidence(
        self, embeddings: np.ndarray, logprob_stats: np.ndarray | None = None, texts: list[str] | None = None
    ) -> np.ndarray:
        if texts is None:
            raise ValueError("TextRouter needs the question texts")
        return self.head.confidence(self.features(texts, embeddings))

    def save(self, path: Path) -> None:
        head = self.head.arrays() if isinstance(self.head, GainModel) else self.head.arrays("head_")
        np.savez_compressed(path, text_columns=self.text_columns.astype(np.int16), embedding=np.str_(self.embedding), center=self.center.astype(np.float32),
                            components=self.components.astype(np.float32), **head)  # fmt: skip


def load_model(path: Path) -> LogisticModel | GainModel | TextRouter | AnswerModel:
    with np.load(path) as data:
        if "features" in data and str(data["features"]) == "answer":
            columns = tuple(data["answer_columns"].tolist()) if "answer_columns" in data else ANSWER_FEATURES
            return AnswerModel(LogisticModel.from_arrays(data), columns=columns)
        head: LogisticModel | GainModel
        if "small_weights" in data:
            head = GainModel(
                LogisticModel.from_arrays(data, "small_"), LogisticModel.from_arrays(data, "large_")
            )
        else:
            head = LogisticModel.from_arrays(data, "head_" if "head_weights" in data else "")
        if "embedding" not in data:
            return head
        return TextRouter(
            data["text_columns"], str(data["embedding"]), data["center"], data["components"], head
        )
