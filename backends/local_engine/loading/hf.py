"""Read a local Hugging Face folder (config.json + *.safetensors + tokenizer.json) of a Llama-family model.

Supports LlamaForCausalLM (Llama 2/3, SmolLM), MistralForCausalLM and Qwen2ForCausalLM (q/k/v biases).
Nothing is downloaded: the folder must hold the files.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from backends.local_engine.loading.checkpoint import Checkpoint, TokenizerSource
from backends.local_engine.model.model_config import ModelConfig

_SUPPORTED = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}


def model_config(raw: dict[str, Any]) -> ModelConfig:
    architecture = (raw.get("architectures") or ["LlamaForCausalLM"])[0]
    if architecture not in _SUPPORTED:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(_SUPPORTED)}")
    num_heads = raw["num_attention_heads"]
    return ModelConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(raw),
        rope_scaling=_rope_scaling(raw),
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        attention_bias=raw.get("attention_bias", architecture == "Qwen2ForCausalLM"),
    )


def _rope_theta(raw: dict[str, Any]) -> float:
    parameters = raw.get("rope_parameters") or {}
    return float(raw.get("rope_theta") or parameters.get("rope_theta") or 10000.0)


def _rope_scaling(raw: dict[str, Any]) -> dict[str, Any]:
    """`rope_scaling` (transformers 4) or `rope_parameters` (transformers 5); {} for plain RoPE."""
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return {} if kind == "default" else dict(scaling, rope_type=kind)


def _generation_eos(folder: Path, config_eos: Any) -> tuple[int, ...]:
    generation = folder / "generation_config.json"
    eos = json.loads(generation.read_text()).get("eos_token_id") if generation.exists() else None
    ids = [*_as_list(eos), *_as_list(config_eos)]
    return tuple(dict.fromkeys(ids))


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def tokenizer_source(folder: Path, raw: dict[str, Any]) -> TokenizerSource:
    tokenizer_json = folder / "tokenizer.json"
    if not tokenizer_json.exists():
        raise FileNotFoundError(f"{tokenizer_json} is missing (only fast tokenizers are supported)")
    tok_config_path = folder / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text()) if tok_config_path.exists() else {}
    template = tok_config.get("chat_template")
    template_file = folder / "chat_template.jinja"
    if template is None and template_file.exists():
        template = template_file.read_text()
    return TokenizerSource(
        tokenizer_json=tokenizer_json,
        chat_template=template,
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_generation_eos(folder, raw.get("eos_token_id")),
    )


def _tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                if not name.endswith("rotary_emb.inv_freq"):
                    yield name, handle.get_tensor(name).float()


def _count_tensors(files: list[Path]) -> int:
    total = 0
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            total += len(handle.keys())
    return total


def load_hf_folder(folder: Path) -> Checkpoint:
    raw = json.loads((folder / "config.json").read_text())
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    return Checkpoint(
        config=model_config(raw),
        tensors=_tensors(files),
        num_tensors=_count_tensors(files),
        tokenizer=tokenizer_source(folder, raw),
        name=folder.name,
    )
