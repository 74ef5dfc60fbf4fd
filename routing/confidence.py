"""Confidence of a small model's answer from its token logprobs, and the scorers a cascade can use."""

import asyncio
import math
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from routing.config import MODELS_DIR, ConfidenceConfig
from routing.learned import AnswerModel, GainModel, LogisticModel, TextRouter, load_model, logprob_features


def choice_logprobs(choice: dict[str, Any]) -> list[float]:
    """Token logprobs of one choice or chunk choice, chat (`content`) or completions (`token_logprobs`)."""
    logprobs = choice.get("logprobs") or {}
    if logprobs.get("content") is not None:
        return [float(t["logprob"]) for t in logprobs["content"]]
    return [float(x) for x in logprobs.get("token_logprobs") or [] if x is not None]


def choice_margins(choice: dict[str, Any]) -> list[float]:
    """Per token, the top-1 minus top-2 logprob (from top_logprobs ≥ 2; empty when the upstream sent none)."""
    logprobs = choice.get("logprobs") or {}
    if logprobs.get("content") is not None:
        tops = [
            [float(t["logprob"]) for t in token.get("top_logprobs") or []] for token in logprobs["content"]
        ]
    else:
        tops = [[float(v) for v in (top or {}).values()] for top in logprobs.get("top_logprobs") or []]
    return [_margin(top) for top in tops if top]


def _margin(top: list[float]) -> float:
    ranked = sorted(top, reverse=True)
    return ranked[0] - ranked[1] if len(ranked) > 1 else 10.0


def mean_logprob(logprobs: list[float]) -> float:
    return sum(logprobs) / len(logprobs) if logprobs else -math.inf


def min_window(logprobs: list[float], window: int) -> float:
    """The lowest mean over `window` consecutive tokens (the mean of all when shorter)."""
    if len(logprobs) <= window:
        return mean_logprob(logprobs)
    sums = np.convolve(np.asarray(logprobs), np.ones(window), mode="valid")
    return float(sums.min() / window)


class Embed(Protocol):
    """Unit-length sentence vectors; cache.embedder.SentenceEmbedder fits, so one MiniLM is shared."""

    def encode(self, texts: list[str]) -> np.ndarray: ...


class Scorer(Protocol):
    needs_answer: bool  # False: decides before the small model is called (a router)
    top_logprobs: int  # alternatives per token the small model is asked for (margins); 0 = none

    async def score(self, question: str, logprobs: list[float], margins: list[float] = ()) -> float: ...

    def quality(self, score: float) -> float | None:
        """The score as an estimated P(small answer correct) for the dashboard, or None."""
        ...


class MeanLogprob:
    needs_answer = True
    top_logprobs = 0

    async def score(self, question: str, logprobs: list[float], margins: list[float] = ()) -> float:
        return mean_logprob(logprobs)

    def quality(self, score: float) -> float | None:
        return math.exp(score)  # the answer tokens' geometric-mean probability: a crude estimate


class MinWindow:
    needs_answer = True
    top_logprobs = 0

    def __init__(self, window: int) -> None:
        self._window = window

    async def score(self, question: str, logprobs: list[float], margins: list[float] = ()) -> float:
        return min_window(logprobs, self._window)

    def quality(self, score: float) -> float | None:
        return math.exp(score)


class AnswerConfidence:
    """The shipped cascade confidence (routing/models/cascade_confidence.npz): P(small answer correct) from
    the answer's logprobs and top-2 margins (training/train_cascade_confidence.py); no embedding."""

    needs_answer = True
    top_logprobs = 2

    def __init__(self, model: AnswerModel) -> None:
        self._model = model

    async def score(self, question: str, logprobs: list[float], margins: list[float] = ()) -> float:
        return self._model.confidence(question, logprobs, list(margins))

    def quality(self, score: float) -> float | None:
        return score  # a calibrated-by-fit P(correct)


class Learned:
    """A learned confidence from the question's embedding (+ logprob stats): P(small answer is good) for
    a LogisticModel, P(small correct) − P(large correct) for a GainModel; a TextRouter (the shipped
    router) also reads the question's text features."""

    top_logprobs = 0

    def __init__(self, model: LogisticModel | GainModel | TextRouter, embedder: Embed) -> None:
        self._model = model
        self._embedder = embedder
        self.needs_answer = model.uses_logprobs

    async def score(self, question: str, logprobs: list[float], margins: list[float] = ()) -> float:
        if isinstance(self._model, TextRouter) and self._model.embedding == "none":
            return float(self._model.confidence(np.zeros((1, 0), np.float32), texts=[question])[0])
        vector = (await asyncio.to_thread(self._embedder.encode, [question]))[0]
        if isinstance(self._model, TextRouter):
            return float(self._model.confidence(vector[None, :], texts=[question])[0])
        extra = logprob_features(logprobs) if self._model.uses_logprobs else None
        return float(self._model.confidence(vector[None, :], None if extra is None else extra[None, :])[0])

    def quality(self, score: float) -> float | None:
        head = self._model.head if isinstance(self._model, TextRouter) else self._model
        return score if isinstance(head, LogisticModel) else None  # a GainModel scores a difference


def default_model_path(method: str) -> Path:
    return MODELS_DIR / ("router_lr.npz" if method == "router" else "cascade_confidence.npz")


def needs_embedder(config: ConfidenceConfig) -> bool:
    """Whether the scorer reads the question's MiniLM embedding (the shipped cascade confidence does not)."""
    if config.method not in ("learned", "router"):
        return False
    model = load_model(Path(config.model_path or default_model_path(config.method)))
    return not isinstance(model, AnswerModel) and not (
        isinstance(model, TextRouter) and model.embedding == "none"
    )


def build_scorer(config: ConfidenceConfig, embedder: Embed | None) -> Scorer:
    if config.method == "mean_logprob":
        return MeanLogprob()
    if config.method == "min_window":
        return MinWindow(config.window)
    model = load_model(Path(config.model_path or default_model_path(config.method)))
    if isinstance(model, AnswerModel):
        return AnswerConfidence(model)
    if embedder is None:
        raise ValueError(f"confidence method {config.method!r} needs the embedding model")
    return Learned(model, embedder)
