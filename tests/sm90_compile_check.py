"""Compile the engine's Triton kernels for an H100/H200 (sm_90) on a machine without a GPU; print usage.

    python -m tests.sm90_compile_check        # one JSON line per kernel variant

Triton compiles down to a cubin with its bundled ptxas; only the launch needs a driver. A stub driver
reports an sm_90 target and refuses everything else, so each wrapper call compiles its kernel and then
fails at launch, which is caught. For every variant: registers, spilled bytes and shared memory (ptxas -v),
or the compile error. tests/test_engine_kernels_sm90.py runs this in a subprocess (a clean, non-interpreted
triton) and asserts every variant compiles without spills.
"""

import importlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


class _Sm90Stub:
    """Just enough of a driver for JITFunction.run to pick a target and compile."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"sm90 stub driver: no {name} (compile only)")


def _usage(kernel: object) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as ptx:
        ptx.write(kernel.asm["ptx"])
    report = subprocess.run(
        [PTXAS, "-arch=sm_90a", "-v", ptx.name, "-o", os.devnull], capture_output=True, text=True
    )
    os.unlink(ptx.name)
    numbers = {
        key: int(match.group(1)) if (match := re.search(pattern, report.stderr)) else -1
        for key, pattern in (
            ("registers", r"Used (\d+) registers"),
            ("spill_stores", r"(\d+) bytes spill stores"),
            ("spill_loads", r"(\d+) bytes spill loads"),
        )
    }
    return numbers | {"shared": kernel.metadata.shared}


def _compile(label: str, kernel_fn: object, call: Callable[[], object]) -> dict:
    cache = kernel_fn.device_caches[0][0]
    before = set(cache)
    try:
        call()
    except Exception as error:  # the launch fails by design; anything else is a compile error
        if "sm90 stub driver" not in str(error):
            return {"kernel": label, "error": f"{type(error).__name__}: {str(error)[:300]}"}
    new = [cache[key] for key in cache if key not in before]
    return {"kernel": label} | (_usage(new[-1]) if new else {"error": "nothing compiled"})


def main() -> None:
    driver.set_active(_Sm90Stub())
    attention = importlib.import_module("backends.local_engine.kernels.triton.paged_attention")
    matmul = importlib.import_module("backends.local_engine.kernels.triton.quant_matmul")
    kernels = matmul.quant_kernels
    heads, kv_heads, dim, block = 32, 8, 128, 16  # Llama-3 8B
    pool = torch.empty(2, 64 * block, kv_heads, dim, dtype=torch.bfloat16)
    tables = torch.zeros(4, 8, dtype=torch.int32)
    lens = torch.zeros(4, dtype=torch.int32)
    starts = torch.zeros(5, dtype=torch.int32)
    decode_q = torch.empty(4, heads, dim, dtype=torch.bfloat16)
    mixed_q = torch.empty(300, heads, dim, dtype=torch.bfloat16)
    results = [
        _compile("decode bf16", attention._paged_attention_kernel,
                 lambda: attention.paged_decode(decode_q, pool, tables, block, lens, 0.1)),
        _compile("decode bf16 splits 8", attention._paged_attention_kernel,
                 lambda: attention.paged_decode(decode_q, pool, tables, block, lens, 0.1, num_splits=8)),
        _compile("varlen bf16", attention._paged_attention_kernel,
                 lambda: attention.paged_attention(mixed_q, pool, tables, block, lens, starts, 0.1)),
        _compile("varlen fp32 window", attention._paged_attention_kernel,
                 lambda: attention.paged_attention(mixed_q.float(), pool.float(), tables, block, lens, starts, 0.1, 512)),
    ]  # fmt: skip
    gemma_pool = torch.empty(2, 64 * block, 1, 256, dtype=torch.bfloat16)  # Gemma 3 270M: 4 heads, 1 KV, 256
    gemma_q = torch.empty(300, 4, 256, dtype=torch.bfloat16)
    results += [
        _compile("gemma3 decode window", attention._paged_attention_kernel,
                 lambda: attention.paged_decode(gemma_q[:4], gemma_pool, tables, block, lens, 0.1, 512)),
        _compile("gemma3 varlen window", attention._paged_attention_kernel,
                 lambda: attention.paged_attention(gemma_q, gemma_pool, tables, block, lens, starts, 0.1, 512)),
    ]  # fmt: skip
    acc = torch.empty(4, 300, heads, dim, dtype=torch.float32)  # the split-K combine, launched on its own
    ml = torch.empty(4, 300, heads, 2, dtype=torch.float32)
    out = torch.empty(300, heads, dim, dtype=torch.bfloat16)
    combine = attention._combine_splits_kernel
    launch = lambda: combine[(300, heads)](acc, ml, out, 300, out.stride(0), out.stride(1), NUM_HEADS=heads,  # noqa: E731
                                           HEAD_DIM=dim, D_PAD=dim, NUM_SPLITS=4, S_PAD=4)  # fmt: skip
    results.append(_compile("split combine", combine, launch))
    n, k = 6144, 4096  # the 8B qkv projection
    q8, scale8 = torch.empty(n, k, dtype=torch.int8), torch.empty(n)
    for m in (1, 16, 128):
        x = torch.empty(m, k, dtype=torch.bfloat16)
        fn = kernels.int8_gemv_kernel if m == 1 else kernels.int8_gemm_kernel
        results.append(_compile(f"int8 m={m}", fn, lambda x=x: matmul.int8_matmul(x, q8, scale8)))
        for group in (32, 128):
            packed = torch.empty(n, k // 2, dtype=torch.uint8)
            sz = torch.empty(k // group, n, 2, dtype=torch.bfloat16)
            fn = kernels.int4_gemv_kernel if m == 1 else kernels.int4_gemm_kernel
            call = lambda x=x, packed=packed, sz=sz, group=group: matmul.int4_matmul(x, packed, sz, group)  # noqa: E731
            results.append(_compile(f"int4 g{group} m={m}", fn, call))
    for result in results:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
