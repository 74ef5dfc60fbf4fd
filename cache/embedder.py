"""Question encodings off the event loop: one worker thread, concurrent requests batched together. The
worker may run at a lower CPU priority than the event loop (`encoder_nice`), so that on a busy machine
requests that skip the semantic cache are not queued behind encodings (measured in bench/cache_latency.py).
The event loop tokenizes (a few tens of µs a question) and, while the worker runs the transformer,
analyses the words (`prepare`: the verifier's per-question tables, cache/alignment.py), so that work is
done before the vectors are back instead of after (docs/cache-measurements.md)."""

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from cache.encoder import EncodedQuestion, QuestionEncoder, Tokens, default_model_path

log = logging.getLogger("llmgw.cache")
Prepare = Callable[[str, tuple[str, ...]], object]  # (text, words): work for later, its result unused


class Embedder(Protocol):
    dim: int

    async def embed(self, text: str) -> EncodedQuestion: ...

    def encode(self, texts: list[str]) -> np.ndarray: ...

    async def aclose(self) -> None: ...


def load_sentence_model(path: str | None, torch_threads: int | None) -> Any:
    """The shipped MiniLM as a sentence-transformers model, never touching the hub (batch scripts)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from sentence_transformers import SentenceTransformer

    if torch_threads:
        torch.set_num_threads(torch_threads)
    return SentenceTransformer(str(path or default_model_path()), device="cpu", local_files_only=True)


class SentenceEmbedder:
    """Encoded questions (normalised float32 sentence vector, inner product = cosine, plus word vectors).
    Requests that arrive while a batch is being encoded are encoded together in the next batch."""

    def __init__(
        self, encoder: QuestionEncoder, batch_size: int = 32, nice: int = 0, prepare: Prepare | None = None
    ) -> None:
        self._encoder = encoder
        self._prepare = prepare
        self.dim = encoder.dim
        self._batch_size = batch_size
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="cache-embed", initializer=_lower_priority, initargs=(nice,)
        )
        self._pending: list[tuple[str, asyncio.Future[EncodedQuestion]]] = []
        self._worker: asyncio.Task[None] | None = None

    def encode(self, texts: list[str]) -> np.ndarray:
        """Sentence vectors only, in the calling thread (batch jobs, the routing package)."""
        return np.concatenate(
            [self._encoder.vectors(texts[i : i + self._batch_size]) for i in range(0, len(texts), self._batch_size)]
        ) if texts else np.zeros((0, self.dim), np.float32)  # fmt: skip

    def encode_questions(self, texts: list[str]) -> list[EncodedQuestion]:
        return self._encoder.encode(texts)

    async def embed(self, text: str) -> EncodedQuestion:
        future: asyncio.Future[EncodedQuestion] = asyncio.get_running_loop().create_future()
        self._pending.append((text, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending[: self._batch_size], self._pending[self._batch_size :]
            try:
                tokens = self._encoder.tokenize([t for t, _ in batch])
                encoding = loop.run_in_executor(self._executor, self._encoder.encode_tokens, tokens)
                self._prepare_words(tokens)  # meanwhile, on this thread (the transformer releases the GIL)
                vectors = await encoding
            except Exception as error:
                _settle(batch, error=error)
            else:
                _settle(batch, vectors=vectors)

    def _prepare_words(self, tokens: list[Tokens]) -> None:
        if self._prepare is None:
            return
        try:
            for t in tokens:
                self._prepare(t.text, t.words)
        except Exception:  # the work is done again, and fails there, where it is needed
            log.warning("cache: preparing a question's words failed", exc_info=True)

    async def aclose(self) -> None:
        if self._worker is not None:
            await asyncio.gather(self._worker, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)


def _lower_priority(nice: int) -> None:
    """Raises this thread's nice value (Linux schedules threads on their own; elsewhere it is a no-op)."""
    if nice > 0:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def _settle(
    batch: list[tuple[str, asyncio.Future[EncodedQuestion]]],
    vectors: list[EncodedQuestion] | None = None,
    error: Exception | None = None,
) -> None:
    for i, (_, future) in enumerate(batch):
        if future.done():
            continue  # the caller went away
        if vectors is not None:
            future.set_result(vectors[i])
        else:
            future.set_exception(error or RuntimeError("embedding failed"))
