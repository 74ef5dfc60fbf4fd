"""Rotary position embeddings (HF "rotate half" layout) with the checkpoint's theta and optional scaling."""

import math

import torch
from torch import Tensor

from backends.local_engine.model.model_config import ModelConfig


def inverse_frequencies(config: ModelConfig, device: torch.device | None = None) -> Tensor:
    """float32 inverse frequencies, computed in float32 as transformers and vLLM compute them (base ** (2j/D)
    in float32 on the model's device, then the scaling), so that fp32 logits reproduce theirs (studies/README.md,
    "fp32 against HF, and a fused 2-64 token layer tried")."""
    exponents = (
        torch.arange(0, config.head_dim, 2, dtype=torch.int64, device=device).float() / config.head_dim
    )
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind != "default":
        raise ValueError(f"unsupported rope scaling {kind!r}")
    return inv_freq


def _llama3_scaled(inv_freq: Tensor, scaling: dict) -> Tensor:
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength <= original / low) & (wavelength >= original / high)
    return torch.where(medium, blended, scaled)


class RotaryTable:
    """Rotation e^(i * position * frequency) for every position up to `max_positions`, complex64.

    The angle is the float32 product position × frequency and its cosine and sine are float32, computed on
    the model's device: transformers' and vLLM's own arithmetic, which the model was trained with.

    Looked up once per step and shared by all layers. Q/K weights are reordered at load time
    (`interleave_rope_rows`) so each rotated pair is adjacent and RoPE is one complex multiply.
    """

    def __init__(self, config: ModelConfig, max_positions: int, device: torch.device) -> None:
        positions = torch.arange(max_positions, dtype=torch.float32, device=device)
        angles = torch.outer(positions, inverse_frequencies(config, device))
        self.rotations = torch.complex(angles.cos(), angles.sin())

    def lookup(self, positions: Tensor) -> Tensor:
        """[T] positions → [T, 1, head_dim / 2] rotations (broadcast over heads)."""
        return self.rotations[positions].unsqueeze(1)


def interleave_rope_rows(weight: Tensor, head_dim: int) -> Tensor:
    """Reorder each head's rows (or bias entries) from rotate-half pairs (j, j + D/2) to adjacent (2j, 2j+1).

    Attention scores are unchanged (q and k get the same order); the KV cache holds keys in this order.
    """
    order = torch.arange(head_dim, device=weight.device).view(2, head_dim // 2).t().flatten()
    return weight.unflatten(0, (-1, head_dim))[:, order].flatten(0, 1)


def rotate_(x: Tensor, rotations: Tensor) -> None:
    """Rotate x [T, heads, head_dim] (adjacent pairs, any strides with unit last stride) in place."""
    pairs = x.unflatten(-1, (-1, 2))
    if x.dtype == torch.float32:
        torch.view_as_complex(pairs).mul_(rotations)
    else:
        pairs.copy_(torch.view_as_real(torch.view_as_complex(pairs.float()) * rotations))
