"""`engine_gpu triton`'s serving shapes (issue 45, item 3): the engine's paged attention where a serving step
puts it, beside its bounds and FlashAttention.

- ragged decode: 128 and 256 sequences with contexts drawn uniformly in 512–2,560 tokens (seeded), the K/V
  they must read against the copy bandwidth measured in the run;
- prefill chunks of a 2,048-token step (one chunk cold, one after 6,144 cached tokens, four ragged chunks over
  ragged prefixes): the engine's `paged_attention` (one call through the block tables) against FlashAttention
  through torch's SDPA (`SDPBackend.FLASH_ATTENTION`, else the efficient backend, named in the row), one call
  per chunk over its context already gathered into contiguous K/V with GQA heads expanded (work the engine's
  kernel does inside its call), causal aligned to the lower right; both as TFLOP/s of the causal FLOPs and as a
  share of the bf16 matmul rate measured in the run.
On the CPU (`--dry-run`) tiny shapes run through the Triton interpreter and SDPA's math backend.
"""

import random
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

DECODE_SEQS = (128, 256)
DECODE_CONTEXT = (512, 2560)
# (cached tokens, new tokens after them) of each chunk in a step
PREFILL_CASES = {
    "one chunk, cold": [(0, 2048)],
    "one chunk after 6,144 cached": [(6144, 2048)],
    "four ragged chunks": [(0, 700), (1500, 512), (4000, 300), (9000, 536)],
}
DRY_PREFILL = {"dry ragged chunks": [(0, 9), (11, 5)]}


def matmul_rate(device: torch.device, timed: Callable[[Callable[[], object], torch.device], float]) -> float:
    """bf16 FLOP/s of a square product (8,192 on CUDA; 256 on the CPU)."""
    n = 8192 if device.type == "cuda" else 256
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    return 2 * n**3 / timed(lambda: a @ b, device)


def paged_case(
    spans: list[tuple[int, int]], heads: int, kv_heads: int, dim: int, device: torch.device,
    dtype: torch.dtype = torch.bfloat16, block: int = 16, spare_blocks: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(q, pool, block tables, context lengths, query starts) for sequences of (cached, new) tokens, their
    blocks scattered through a random pool (`spare_blocks` more than they need). The one builder of paged
    attention inputs for bench/lib/engine_kernels.py and engine_gpu_kernels.py."""
    widths = [-(-(cached + new) // block) for cached, new in spans]
    blocks = sum(widths) + spare_blocks
    pool = torch.randn(2, blocks * block, kv_heads, dim, device=device, dtype=dtype)
    order = torch.randperm(blocks, device=device).int()
    tables = torch.zeros(len(spans), max(widths), dtype=torch.int32, device=device)
    first = 0
    for row, width in enumerate(widths):
        tables[row, :width] = order[first : first + width]
        first += width
    q = torch.randn(sum(new for _, new in spans), heads, dim, device=device, dtype=dtype)
    lens = torch.tensor([cached + new for cached, new in spans], dtype=torch.int32, device=device)
    starts = torch.tensor([0, *torch.tensor([n for _, n in spans]).cumsum(0).tolist()], dtype=torch.int32,
                          device=device)  # fmt: skip
    return q, pool, tables, lens, starts


def decode_rows(
    shape: str, heads: tuple[int, int, int], device: torch.device, bandwidth: float, kernels: tuple
) -> list[dict]:
    """Paged decode over ragged contexts: µs and the share of the copy bandwidth its K/V bytes take."""
    attention, timed, row_of = kernels
    h, kvh, dim = heads
    rng = random.Random(45)
    out = []
    for seqs in DECODE_SEQS if shape != "dry" else (3,):
        low, high = DECODE_CONTEXT if shape != "dry" else (20, 70)
        contexts = [rng.randint(low, high) for _ in range(seqs)]
        q, pool, tables, lens, starts = paged_case([(c - 1, 1) for c in contexts], h, kvh, dim, device)
        splits = attention.choose_num_splits(seqs, kvh, max(contexts), _sms(device))
        run = partial(attention.paged_decode, q, pool, tables, 16, lens, dim**-0.5, num_splits=splits)
        flops, nbytes = attention.attention_flops_bytes([1] * seqs, contexts, h, kvh, dim, 2)
        row = row_of(f"decode {seqs} seqs ctx {low}-{high}", f"paged_decode splits={splits}", timed(run, device),
                     nbytes, bandwidth, None, None)  # fmt: skip
        out.append(row | {"TFLOP/s": flops / (row["us"] * 1e-6) / 1e12})
    return out


def prefill_rows(
    shape: str, heads: tuple[int, int, int], device: torch.device, rate: float, kernels: tuple
) -> list[dict]:
    """Each prefill case through the engine's kernel and through SDPA's FlashAttention."""
    attention, timed, _ = kernels
    h, kvh, dim = heads
    out = []
    for case, spans in (PREFILL_CASES if shape != "dry" else DRY_PREFILL).items():
        q, pool, tables, lens, starts = paged_case(spans, h, kvh, dim, device)
        ours = partial(attention.paged_attention, q, pool, tables, 16, lens, starts, dim**-0.5)
        flash, backend = flash_calls(q, pool, tables, lens, starts, h // kvh, device)
        expected = torch.cat([call() for call in flash])
        flops, _ = attention.attention_flops_bytes(
            [n for _, n in spans], [c + n for c, n in spans], h, kvh, dim, 2
        )
        error = float((ours().float() - expected.float()).abs().max() / expected.float().abs().max())
        for kernel, run in (
            ("paged_attention (ours)", ours),
            (f"SDPA {backend}", partial(_all, flash)),
        ):
            seconds = timed(run, device)
            out.append({"case": case, "kernel": kernel, "us": seconds * 1e6, "TFLOP/s": flops / seconds / 1e12,
                        "pct_matmul_rate": 100 * flops / seconds / rate, "rel_error": error})  # fmt: skip
    return out


def flash_calls(
    q: torch.Tensor, pool: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor, starts: torch.Tensor,
    per_kv: int, device: torch.device,
) -> tuple[list[Callable[[], torch.Tensor]], str]:  # fmt: skip
    """One SDPA call per sequence over its gathered context ([T, H, D] out each), and the backend that ran."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    calls = []
    for seq in range(lens.shape[0]):
        start, end, ctx = int(starts[seq]), int(starts[seq + 1]), int(lens[seq])
        positions = torch.arange(ctx, device=device)
        slots = tables[seq].long()[positions // 16] * 16 + positions % 16
        keys, values = pool[:, slots].repeat_interleave(per_kv, dim=2).transpose(1, 2).unsqueeze(1).unbind(0)
        queries = q[start:end].transpose(0, 1).unsqueeze(0)
        mask = causal_lower_right(end - start, ctx)
        calls.append(partial(_sdpa, queries, keys.contiguous(), values.contiguous(), mask))
    cuda = device.type == "cuda"
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION] if cuda else [SDPBackend.MATH]
    for backend in backends:
        try:
            with sdpa_kernel(backend):
                for call in calls:
                    call()
        except RuntimeError:
            continue
        return [partial(_within, backend, call) for call in calls], backend.name.lower()
    raise RuntimeError("no SDPA backend ran the prefill cases")


def _all(calls: list[Callable[[], torch.Tensor]]) -> list[torch.Tensor]:
    return [call() for call in calls]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).squeeze(0).transpose(0, 1)


def _within(backend: object, call: Callable[[], torch.Tensor]) -> torch.Tensor:
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return call()


def _sms(device: torch.device) -> int:
    from backends.local_engine.kernels.triton.quant_matmul import sm_count

    return sm_count(device)
