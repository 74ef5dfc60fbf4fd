"""Rotary position embeddings (HF "rotate half" layout) with the checkpoint's theta and optional scaling."""

import math

import torch
from torch import Tensor

from backends.local_engine.model_config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> Tensor:
    exponents = torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim
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
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    medium = (wavelength <= original / low) & (wavelength >= original / high)
    return torch.where(medium, blended, scaled)


class RotaryTable:
    """cos/sin for every position up to `max_positions`, looked up once per step and shared by all layers."""

    def __init__(
        self, config: ModelConfig, max_positions: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inverse_frequencies(config))
        self.cos = angles.cos().to(dtype=dtype, device=device)
        self.sin = angles.sin().to(dtype=dtype, device=device)

    def lookup(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """[T] positions → cos, sin of shape [T, 1, head_dim / 2] (broadcast over heads)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [T, heads, head_dim] rotated in the rotate-half convention."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
