"""Exports the shipped MiniLM transformer to ONNX (and an int8 copy) on first use, so the cache can run
it on ONNX Runtime: on this 2-core machine a short question takes a fraction of torch's time, and the
int8 copy (weights quantised per output channel, which keeps sentence vectors at cosine 0.994 of fp32's;
per-tensor scales gave 0.975 at the same speed) about half of fp32's (measured in bench/cache_latency.py).
Nothing large is committed: the files are made from the installed weights into a local folder (LLMGW_CACHE__ONNX_DIR, default ~/.cache/llmgw/onnx) and reused afterwards."""

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("llmgw.cache")


def default_onnx_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llmgw" / "onnx"


def onnx_model(model_path: Path, folder: Path, int8: bool) -> Path:
    """The exported encoder for these weights, made now when it is missing."""
    weights = model_path / "model.safetensors"
    tag = hashlib.sha256(
        f"{weights}:{weights.stat().st_size}:{weights.stat().st_mtime_ns}".encode()
    ).hexdigest()[:12]
    return cached_onnx(folder, f"minilm-{tag}", int8, lambda out: _export(model_path, out))


def cached_onnx(folder: Path, name: str, int8: bool, export: Callable[[Path], None]) -> Path:
    """`folder/name.onnx` (made by `export` when missing), or its int8 per-channel copy."""
    fp32 = folder / f"{name}.onnx"
    target = folder / f"{name}-int8pc.onnx" if int8 else fp32
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    if not fp32.exists():
        partial = fp32.with_suffix(".partial")
        export(partial)
        partial.replace(fp32)
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        partial = target.with_suffix(".partial")
        quantize_dynamic(str(fp32), str(partial), weight_type=QuantType.QInt8, per_channel=True)
        partial.replace(target)
    return target


def _export(model_path: Path, out: Path) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModel

    log.info("cache: exporting %s to ONNX at %s (first use)", model_path, out)
    model = _HiddenStates(AutoModel.from_pretrained(str(model_path), local_files_only=True).eval())
    export_module(model, out, "last_hidden_state", {0: "batch", 1: "tokens"})


def export_module(model: object, out: Path, output: str, output_axes: dict[int, str]) -> None:
    """ONNX of a module called with (input_ids, attention_mask, token_type_ids), batch and length dynamic."""
    import torch

    ids = torch.ones((2, 8), dtype=torch.long)
    inputs = ("input_ids", "attention_mask", "token_type_ids")
    with torch.inference_mode():
        torch.onnx.export(
            model,
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(out),
            input_names=list(inputs),
            output_names=[output],
            dynamic_axes={n: {0: "batch", 1: "tokens"} for n in inputs} | {output: output_axes},
            opset_version=17,
            dynamo=False,
        )


def _hidden_states_module() -> type:
    import torch

    class HiddenStates(torch.nn.Module):
        """Keyword arguments for the transformer (its positional order changes between versions)."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    return HiddenStates


def _HiddenStates(model: object) -> object:  # noqa: N802
    return _hidden_states_module()(model)
