"""Fused elementwise kernels for the CUDA forward pass (Triton): fewer, larger launches per layer.

A decode step at batch 1 is a few hundred kernels; those that only touch a few kilobytes cost ~2 us each
all the same, which at 1B is as much as the matmuls. These fuse what the eager model does in several:
- `add_rms_norm`: residual add + RMSNorm (one read of each input, residual and normed out);
- `silu_mul`: SwiGLU's silu(gate) * up from the fused gate_up output;
- `rope_write_kv`: RoPE on q and k (adjacent pairs, rope.py's layout) in place, and the new K/V written
  to their pool slots, so no separate index_copy_.
All arithmetic is fp32; results are rounded once to the activation dtype.
"""

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

if triton is not None:

    @triton.jit
    def _add_rms_norm_kernel(
        x_ptr, r_ptr, w_ptr, out_ptr, res_ptr, n, stride_x, stride_r, stride_o, stride_res, eps,
        HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            x += tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
            rounded = x.to(res_ptr.dtype.element_ty)
            tl.store(res_ptr + row * stride_res + cols, rounded, mask=mask)
            x = rounded.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / n + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, inner, stride_g, stride_o, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inner
        gate = tl.load(gu_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * stride_g + inner + cols, mask=mask, other=0.0).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rope_write_kv_kernel(
        qkv_ptr, pos_ptr, rot_ptr, slot_ptr, k_ptr, v_ptr, stride_t, stride_slot, stride_kvh,
        HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    ):  # fmt: skip
        token = tl.program_id(0)
        head = tl.program_id(1)
        pairs = tl.arange(0, HALF)
        base = qkv_ptr + token * stride_t + head * (2 * HALF)
        slot = tl.load(slot_ptr + token)
        if head < HEADS + KV_HEADS:
            position = tl.load(pos_ptr + token)
            even = tl.load(base + 2 * pairs).to(tl.float32)
            odd = tl.load(base + 2 * pairs + 1).to(tl.float32)
            cos = tl.load(rot_ptr + position * (2 * HALF) + 2 * pairs)
            sin = tl.load(rot_ptr + position * (2 * HALF) + 2 * pairs + 1)
            new_even = (even * cos - odd * sin).to(qkv_ptr.dtype.element_ty)
            new_odd = (even * sin + odd * cos).to(qkv_ptr.dtype.element_ty)
            if head < HEADS:
                tl.store(base + 2 * pairs, new_even)
                tl.store(base + 2 * pairs + 1, new_odd)
            else:
                dest = k_ptr + slot * stride_slot + (head - HEADS) * stride_kvh
                tl.store(dest + 2 * pairs, new_even)
                tl.store(dest + 2 * pairs + 1, new_odd)
        else:
            dims = tl.arange(0, 2 * HALF)
            dest = v_ptr + slot * stride_slot + (head - HEADS - KV_HEADS) * stride_kvh
            tl.store(dest + dims, tl.load(base + dims))


def add_rms_norm(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(rms_norm(x + residual) * weight, x + residual); with no residual, (rms_norm(x) * weight, x)."""
    rows, n = x.shape
    out = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else x
    _add_rms_norm_kernel[(rows,)](
        x, x if residual is None else residual, weight, out, summed, n, x.stride(0),
        x.stride(0) if residual is None else residual.stride(0), out.stride(0), summed.stride(0), eps,
        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n),
    )  # fmt: skip
    return out, summed


def silu_mul(gate_up: Tensor) -> Tensor:
    rows, width = gate_up.shape
    inner = width // 2
    out = torch.empty(rows, inner, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(inner, block))](
        gate_up, out, inner, gate_up.stride(0), out.stride(0), BLOCK=block
    )
    return out


def rope_write_kv(
    qkv: Tensor, positions: Tensor, rotations: Tensor, slot_mapping: Tensor, pool: Tensor, heads: int,
    kv_heads: int,
) -> None:  # fmt: skip
    """qkv [T, (heads + 2 kv_heads) * D]: rotate q and k (rotations: complex64 [positions, D / 2]) in
    place, and write the rotated k and the v of each token to its slot of `pool` [2, slots, KVH, D]."""
    tokens = qkv.shape[0]
    head_dim = pool.shape[-1]
    table = torch.view_as_real(rotations)
    _rope_write_kv_kernel[(tokens, heads + 2 * kv_heads)](
        qkv, positions, table, slot_mapping, pool[0], pool[1], qkv.stride(0), pool.stride(1), pool.stride(2),
        HEADS=heads, KV_HEADS=kv_heads, HALF=head_dim // 2,
    )  # fmt: skip
