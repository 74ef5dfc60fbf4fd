"""Where our fp32 logits part from HF's (issue 17, correctness): engine variants against one HF fp32 model.

    python3 -m studies.engine_gpu_fp32 [--shapes llama-8b,llama-1b] [--variants f64rope,fused,default,...]

bench/engine_gpu.py's `correct` section measures one number (max |logit - HF|, fp32, teacher-forced
prefill and decode graphs). This script measures it for variants of our fp32 forward pass, each built
from the same HF model, so that each difference in summation order or arithmetic can be priced:
  f64rope    the engine of before 2026-12-04: float64 RoPE angles (then rounded), fused q/k/v and gate/up
  fused      float32 RoPE angles as HF computes them, q/k/v and gate/up still fused
  default    the engine as shipped: also q/k/v and gate/up as HF's separate matmuls (quant.ConcatLinear;
             cuBLAS picks its kernel, and so its summation order, by shape)
  torchnorm  default, and the residual add + RMSNorm in HF's own torch ops instead of the Triton kernel
  torchsilu  torchnorm, and SwiGLU as F.silu(gate) * up
(The 2026-12-04 results, engine_gpu_fp32.json, name these fused, default, split: its "default" was the
fused row, its "split" the shipped one.)
The HF model in float64 gives the floor: how far HF's own fp32 logits are from exact arithmetic.
A table is printed last; JSON goes to --out as engine_gpu_fp32.json.
"""

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.engine_gpu import decode_logits, teacher_forced_logits
from bench.lib.engine_gpu_models import build_hf, build_ours, hf_logits, hf_static, random_prompts

VARIANTS = ("f64rope", "fused", "default", "torchnorm", "torchsilu")


def torch_add_rms_norm(
    x: Tensor, residual: Tensor | None, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """HF's LlamaRMSNorm after HF's residual add, as fused_triton.add_rms_norm's drop-in."""
    hidden = x if residual is None else residual + x
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + eps)), hidden


def torch_silu_mul(gate_up: Tensor) -> Tensor:
    gate, up = gate_up.chunk(2, -1)
    return F.silu(gate) * up


def f64_rotations(config, max_positions: int, device: torch.device) -> Tensor:
    """The table of before: float64 inverse frequencies and angles, rounded to complex64 at the end."""
    import math

    exponents = torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        original = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        smooth = (original / wavelength - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
        medium = (wavelength <= original / low) & (wavelength >= original / high)
        inv_freq = torch.where(medium, blended, scaled)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64).to(device)


@contextlib.contextmanager
def patched(variant: str) -> Iterator[None]:
    from backends.local_engine.kernels.triton import fused as fused_triton
    from backends.local_engine.loading import weights
    from backends.local_engine.model import rope

    saved = (weights.ModelBuilder._stacked, fused_triton.add_rms_norm, fused_triton.silu_mul)
    saved_init = rope.RotaryTable.__init__
    if variant == "f64rope":  # before the engine captures its graphs, which hold the table's address

        def f64_init(self, config, max_positions: int, device: torch.device) -> None:
            self.rotations = f64_rotations(config, max_positions, device)

        rope.RotaryTable.__init__ = f64_init
    level = VARIANTS.index(variant)
    if level < VARIANTS.index("default"):  # one matmul over the stacked weights, as other formats run

        def fused(
            self, parts: list[Tensor], biases: list[Tensor] | None = None, gate_up: bool = False
        ) -> nn.Module:
            return self._linear(torch.cat(parts), None if biases is None else torch.cat(biases), gate_up)

        weights.ModelBuilder._stacked = fused
    if level >= VARIANTS.index("torchnorm"):
        fused_triton.add_rms_norm = torch_add_rms_norm
    if level >= VARIANTS.index("torchsilu"):
        fused_triton.silu_mul = torch_silu_mul
    try:
        yield
    finally:
        weights.ModelBuilder._stacked, fused_triton.add_rms_norm, fused_triton.silu_mul = saved
        rope.RotaryTable.__init__ = saved_init


def max_diff(rows: list[Tensor], refs: list[Tensor]) -> float:
    return max(
        float((r.cpu().double() - e.cpu().double()).abs().max()) for r, e in zip(rows, refs, strict=True)
    )


def shape_rows(shape: str, variants: list[str]) -> dict:
    hf = build_hf(shape, torch.device("cuda"), torch.float32)
    vocab = hf.config.vocab_size
    prompts = random_prompts(4, 48, 64, vocab, 11)  # bench/engine_gpu.py's correctness prompts
    reference = [p + out for p, out in zip(prompts, hf_static(hf, prompts, 1, 32), strict=True)]
    ref_logits = [hf_logits(hf, ids)[len(ids) - 33 : -1] for ids in reference]
    rows: dict = {}
    ours_by_variant: dict[str, list[Tensor]] = {}
    for variant in variants:
        with patched(variant):
            ours = build_ours(hf, shape, "fp32", 4, 512)
            prefill = [teacher_forced_logits(ours, ids, len(ids) - 32).cpu() for ids in reference]
            decode = [decode_logits(ours, ids, len(ids) - 32).cpu() for ids in reference[:2]]
            ours.free()
        ours_by_variant[variant] = prefill
        rows[variant] = {
            "prefill": max_diff(prefill, ref_logits),
            "decode_graph": max_diff(decode, ref_logits[:2]),
        }
        print(shape, variant, rows[variant], flush=True)
        torch.cuda.empty_cache()
    hf.double()
    exact = [hf_logits(hf, ids, torch.float64)[len(ids) - 33 : -1].cpu() for ids in reference]
    rows["HF fp32 vs float64"] = max_diff([r.cpu() for r in ref_logits], exact)
    for variant, prefill in ours_by_variant.items():
        rows[variant]["prefill_vs_float64"] = max_diff(prefill, exact)
    rows["max |logit|"] = float(max(r.abs().max() for r in ref_logits))
    del hf
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="llama-8b,llama-1b")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=os.environ.get("OUT", "studies/results"))
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results: dict = {"device": torch.cuda.get_device_name(), "args": vars(args), "shapes": {}}
    for shape in args.shapes.split(","):
        results["shapes"][shape] = shape_rows(shape, args.variants.split(","))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "engine_gpu_fp32.json").write_text(json.dumps(results, indent=1))
    print(f"\n{'shape':10s} {'variant':10s} {'prefill':>10s} {'decode':>10s} {'vs fp64':>10s}")
    for shape, rows in results["shapes"].items():
        for variant, row in rows.items():
            if isinstance(row, dict):
                print(f"{shape:10s} {variant:10s} {row['prefill']:10.3e} {row['decode_graph']:10.3e} "
                      f"{row['prefill_vs_float64']:10.3e}")  # fmt: skip
        print(
            f"{shape:10s} HF fp32 vs float64: {rows['HF fp32 vs float64']:.3e}, max |logit| {rows['max |logit|']:.2f}"
        )


if __name__ == "__main__":
    main()
