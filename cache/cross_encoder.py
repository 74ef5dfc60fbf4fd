"""The cross-encoder verifier: the shipped all-MiniLM-L6-v2 reads the stored question and the new one
together ("[CLS] stored [SEP] new [SEP]", the new one as segment 1) and a linear head on the mean of its
last hidden states gives the logit that one answer serves both. Unlike a comparison of two separate
encodings, attention sees word order and which words meet which, so role reversals ("tenant evicts
landlord"), added constraints and scope changes are visible to it.

Weights: the package's MiniLM plus a low-rank update (LoRA) of every attention and MLP projection, the two
token-type embeddings and the head: ~0.7 M numbers in cache/verifier_model/cross_encoder.npz, trained by
training/train_cross_verifier.py. At first use the merged model is exported to ONNX and quantised to int8 per
channel into the ONNX folder (cache/onnx_export.py), like the encoder, so nothing large is committed.
The LoRA layer is hand-written (a dozen lines): peft would add accelerate and more to the training box,
and only the merged weights ever run.

torch and transformers are imported only to train or to export (they come with the semantic extra)."""

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("llmgw.cache")

# the Linear layers of each BERT layer that get a low-rank update (module paths under encoder.layer.N)
TARGETS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)
MAX_TOKENS = 128


class PairTokenizer:
    """The MiniLM tokenizer (uncased WordPiece, tokenizer.json of the package) on question pairs."""

    def __init__(self, model_path: Path, max_tokens: int = MAX_TOKENS) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_tokens)

    def __call__(self, pairs: Sequence[tuple[str, str]]) -> dict[str, np.ndarray]:
        """Padded int64 arrays: input_ids, attention_mask, token_type_ids."""
        encodings = self._tokenizer.encode_batch([(a, b) for a, b in pairs])
        width = max(len(e.ids) for e in encodings)
        out = {
            n: np.zeros((len(encodings), width), np.int64)
            for n in ("input_ids", "attention_mask", "token_type_ids")
        }
        for row, e in enumerate(encodings):
            out["input_ids"][row, : len(e.ids)] = e.ids
            out["attention_mask"][row, : len(e.ids)] = 1
            out["token_type_ids"][row, : len(e.ids)] = e.type_ids
        return out


def _modules() -> tuple[type, type]:
    """The torch modules (defined on first use so that importing this file does not import torch)."""
    import torch
    from torch import nn

    class LoraLinear(nn.Module):
        """base(x) + scale · B(A(x)), the base frozen; B starts at zero so training starts from the base."""

        def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float) -> None:
            super().__init__()
            self.base = base
            self.a = nn.Parameter(torch.empty(rank, base.in_features))
            self.b = nn.Parameter(torch.zeros(base.out_features, rank))
            nn.init.kaiming_uniform_(self.a, a=5**0.5)
            self.scale = alpha / rank
            self.dropout = nn.Dropout(dropout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + self.scale * ((self.dropout(x) @ self.a.t()) @ self.b.t())

    class PairModel(nn.Module):
        """BERT over the pair, mean of the last hidden states over real tokens, one logit."""

        def __init__(self, bert: nn.Module) -> None:
            super().__init__()
            self.bert = bert
            self.head = nn.Linear(bert.config.hidden_size, 1)

        def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
            return self.head(pooled).squeeze(-1)

    return LoraLinear, PairModel


def _targets(bert: Any) -> list[tuple[Any, str, str]]:
    """(parent module, attribute, full name) of every Linear that gets an update."""
    found = []
    for index, layer in enumerate(bert.encoder.layer):
        for path in TARGETS:
            *parents, attribute = path.split(".")
            parent = layer
            for name in parents:
                parent = getattr(parent, name)
            found.append((parent, attribute, f"layer{index}.{path}"))
    return found


def build_model(
    model_path: Path, adapter: dict[str, np.ndarray] | None = None, rank: int = 16, alpha: float = 32.0,
    dropout: float = 0.1,
) -> Any:  # fmt: skip
    """With `adapter`: the merged model for inference (eval mode). Without: the trainable model, LoRA
    layers in place and only the updates, the token-type embeddings and the head trainable."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoModel

    lora_linear, pair_model = _modules()
    bert = AutoModel.from_pretrained(str(model_path), local_files_only=True, dtype=torch.float32)
    model = pair_model(bert)
    if adapter is None:
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        for parent, attribute, _ in _targets(bert):
            setattr(parent, attribute, lora_linear(getattr(parent, attribute), rank, alpha, dropout))
        for parameter in (*model.head.parameters(), bert.embeddings.token_type_embeddings.weight):
            parameter.requires_grad_(True)
        return model
    with torch.no_grad():
        for parent, attribute, name in _targets(bert):
            linear = getattr(parent, attribute)
            update = (
                torch.from_numpy(adapter[f"{name}.b"]).float()
                @ torch.from_numpy(adapter[f"{name}.a"]).float()
            )
            linear.weight += update
        bert.embeddings.token_type_embeddings.weight.copy_(torch.from_numpy(adapter["token_type"]).float())
        model.head.weight.copy_(torch.from_numpy(adapter["head.weight"]).float())
        model.head.bias.copy_(torch.from_numpy(adapter["head.bias"]).float())
    return model.eval()


def adapter_state(model: Any) -> dict[str, np.ndarray]:
    """The trained numbers of `build_model(adapter=None)`'s model, the LoRA scale folded into B."""
    state: dict[str, np.ndarray] = {}
    for parent, attribute, name in _targets(model.bert):
        lora = getattr(parent, attribute)
        state[f"{name}.a"] = lora.a.detach().float().cpu().numpy()
        state[f"{name}.b"] = (lora.b.detach().float() * lora.scale).cpu().numpy()
    state["token_type"] = model.bert.embeddings.token_type_embeddings.weight.detach().float().cpu().numpy()
    state["head.weight"] = model.head.weight.detach().float().cpu().numpy()
    state["head.bias"] = model.head.bias.detach().float().cpu().numpy()
    return state


def export_onnx(model_path: Path, adapter_file: Path, out: Path) -> None:
    """The merged model as ONNX: (input_ids, attention_mask, token_type_ids) → logits."""
    from cache.onnx_export import export_module

    log.info("cache: exporting the cross-encoder verifier to ONNX at %s (first use)", out)
    export_module(build_model(model_path, dict(np.load(adapter_file))), out, "logits", {0: "batch"})


class CrossEncoder:
    """Probabilities for (stored, new) question pairs, on ONNX Runtime."""

    def __init__(self, onnx_path: Path, model_path: Path, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # shared cores: no busy-wait
        self._session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        self._tokenize = PairTokenizer(model_path)
        self.path = onnx_path

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        if not pairs:
            return np.zeros(0)
        (logits,) = self._session.run(["logits"], self._tokenize(pairs))
        return 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))


def adapter_tag(adapter_file: Path) -> str:
    return hashlib.sha256(adapter_file.read_bytes()).hexdigest()[:12]


def load_cross_encoder(adapter_file: Path, onnx_dir: Path | None = None, int8: bool = True) -> CrossEncoder:
    """The shipped cross-encoder, exported on first use (a few seconds) and reused afterwards."""
    from cache.encoder import default_model_path
    from cache.onnx_export import cached_onnx, default_onnx_dir

    model_path = default_model_path()
    base = model_path / "model.safetensors"
    tag = hashlib.sha256(f"{base}:{base.stat().st_size}:{adapter_tag(adapter_file)}".encode()).hexdigest()[
        :12
    ]
    onnx_path = cached_onnx(
        onnx_dir or default_onnx_dir(),
        f"cross-{tag}",
        int8,
        lambda out: export_onnx(model_path, adapter_file, out),
    )
    return CrossEncoder(onnx_path, model_path)
