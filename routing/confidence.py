"""Confidence of a small model's answer from its token logprobs, and the scorers a cascade can use."""

import asyncio
import math
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from routing.config import MODELS_DIR, ConfidenceConfig
from routing.learned import GainModel, LogisticModel, TextRouter, load_model, logprob_features


def choice_logprobs(choice: dict[str, Any]) -> list[float]:
    """Token logprobs of one choice or chunk choice, chat (`content`) or completions (`token_logprobs`)."""
    logprobs = choice.get("logprobs") or {}
    if logprobs.get("content") is not None:
        return [float(t["logprob"]) for t in logprobs["content"]]
    return [float(x) for x in logprobs.get("token_logprobs") or [] if x is not None]


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

    async def score(self, question: str, logprobs: list[float]) -> float: ...


class MeanLogprob:
    needs_answer = True

    async def score(self, question: str, logprobs: list[float]) -> float:
        return mean_logprob(logprobs)


class MinWindow:
    needs_answer = True

    def __init__(self, window: int) -> None:
        self._window = window

    async def score(self, question: str, logprobs: list[float]) -> float:
        return min_window(logprobs, self._window)


class Learned:
    """A learned confidence from the question's embedding (+ logprob stats): P(small answer is good) for
    a LogisticModel, P(small correct) − P(large correct) for a GainModel; a TextRouter (the shipped
    router) also reads the question's text features."""

    def __init__(self, model: LogisticModel | GainModel | TextRouter, embedder: Embed) -> None:
        self._model = model
        self._embedder = embedder
        self.needs_answer = model.uses_logprobs

    async def score(self, question: str, logprobs: list[float]) -> float:
        if isinstance(self._model, TextRouter) and self._model.embedding == "none":
            return float(self._model.confidence(np.zeros((1, 0), np.float32), texts=[question])[0])
        vector = (await asyncio.to_thread(self._embedder.encode, [question]))[0]
        if isinstance(self._model, TextRouter):
            return float(self._model.confidence(vector[None, :], texts=[question])[0])
        extra = logprob_features(logprobs) if self._model.uses_logprobs else None
        return float(self._model.confidence(vector[None, :], None if extra is None else extra[None, :])[0])


def default_model_path(method: str) -> Path:
    return MODELS_DIR / ("router_lr.npz" if method == "router" else "cascade_lr.npz")


def build_scorer(config: ConfidenceConfig, embedder: Embed | None) -> Scorer:
    if config.method == "mean_logprob":
        return MeanLogprob()
    if config.method == "min_window":
        return MinWindow(config.window)
    if embedder is None:
        raise ValueError(f"confidence method {config.method!r} needs the embedding model")
    model = load_model(Path(config.model_path or default_model_path(config.method)))
    return Learned(model, embedder)
