"""Our engine on one GPU beside HF transformers (issue 17), random-weight Llama-3 1B / 8B and Qwen2 shapes.

    python3 -m bench.engine_gpu [--only bw,kernels,decode,clients,prefix,correct] [--shapes llama-1b,llama-8b]
        [--out DIR]

Sections (all in-process: the engine loop without HTTP, closed-loop clients driven step by step):
  bw       device-to-device copy bandwidth (bytes read + written): the roofline's denominator
  kernels  paged attention (ours / kernels/) and int8 matmul against torch references on the device
  decode   batch-1 decode tok/s per format (bf16, int8, int4) and % of roofline = tok/s x decode bytes / bw;
           HF generate bf16 beside it
  clients  closed-loop throughput at 1 / 32 / 128 clients (random prompts of 96-160 tokens, 128 greedy
           tokens each, two requests per client), ours vs HF static batching (generate on padded batches)
  prefix   TTFT of a request with a 1024-token shared prefix + 32 own tokens: cold vs prefix-cached
  correct  fp32 logits vs HF (max |diff|, prefill and decode steps); greedy top-1 agreement with an fp32
           reference (teacher forced over reference continuations) for our bf16/int8/int4 and HF's bf16
The summary table is printed last; JSON goes to --out (default bench/results) as engine_gpu.json.
"""

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

import torch

from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.sequence import ScheduledSeq, Sequence
from bench.engine_gpu_models import (
    Ours,
    build_hf,
    build_ours,
    decode_bytes,
    hf_decode_bytes,
    hf_decode_logits,
    hf_logits,
    hf_static,
    random_prompts,
    sync,
    timed,
)  # fmt: skip

CLIENTS = (1, 32, 128)
FORMATS = ("bf16", "int8", "int4")
NEW_TOKENS = 128
RESULTS: dict = {"device": None, "sections": {}}
_START = time.perf_counter()


def record(section: str, key: str, value) -> None:
    RESULTS["sections"].setdefault(section, {})[key] = value
    print(f"[{time.perf_counter() - _START:.0f}s] [{section}] {key}: {json.dumps(value)}", flush=True)


def copy_bandwidth() -> float:
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    seconds = timed(lambda dst=dst, src=src: [dst.copy_(src) for _ in range(20)]) / 20
    del src, dst
    return 2 * 2 * 1024**3 / seconds


# --- engine drivers --------------------------------------------------------------------------------------


def run_closed_loop(ours: Ours, prompts: list[list[int]], clients: int, new_tokens: int) -> dict:
    """`clients` requests in flight, a new one as soon as one finishes; output tok/s over the whole run."""
    engine = ours.engine
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    queue, produced, steps = list(prompts), 0, 0

    def loop() -> None:
        nonlocal produced, steps
        while queue and engine.num_requests < clients:
            engine.add_request(queue.pop(0), params)
        while engine.has_work:
            for out in engine.step():
                produced += len(out.new_token_ids)
                if out.finish_reason is not None and queue:
                    engine.add_request(queue.pop(0), params)
            steps += 1

    seconds = timed(loop)
    return {"output_tok_s": produced / seconds, "seconds": seconds, "tokens": produced, "steps": steps}


def batch1_decode(ours: Ours, vocab: int, new_tokens: int = NEW_TOKENS, repeats: int = 3) -> list[float]:
    """Decode tok/s of one request (prefill excluded), through the whole engine step: one untimed request
    first (GPU clocks up from idle, first replays), then `repeats` timed ones. A 1B request of 128 tokens
    takes ~0.13 s, short enough for one sample to swing by several percent."""
    engine = ours.engine
    params = SamplingParams(max_tokens=new_tokens + 1, temperature=0.0, ignore_eos=True)
    runs = []
    for repeat in range(repeats + 1):
        engine.add_request(random_prompts(1, 128, 128, vocab, 7 + repeat)[0], params)
        engine.step()  # prefill + first token
        tokens = 0

        def loop() -> None:
            nonlocal tokens
            while engine.has_work:
                tokens += sum(len(out.new_token_ids) for out in engine.step())

        seconds = timed(loop)
        if repeat:
            runs.append(tokens / seconds)
    return runs


def ttft(ours: Ours, prompt: list[int]) -> float:
    engine = ours.engine
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def first() -> None:
        engine.add_request(prompt, params)
        while engine.has_work:
            engine.step()

    return timed(first)


def teacher_forced_logits(ours: Ours, ids: list[int], first: int) -> torch.Tensor:
    """Logits of positions first-1 .. len-2 (predicting ids[first:]) in one prefill step."""
    runner = ours.runner
    seq = Sequence(list(ids))
    seq.block_table = list(range(-(-len(ids) // runner.block_size)))
    out = runner.execute([ScheduledSeq(seq, len(ids), len(ids) - first + 1)])[0].logits
    return out[:-1].float()


def decode_logits(ours: Ours, ids: list[int], first: int, graphs: bool = True) -> torch.Tensor:
    """Logits predicting ids[first:], computed by a prefill of ids[:first] then one decode step per token
    (replaying the CUDA graph, or eagerly with `graphs` False)."""
    runner = ours.runner
    saved = runner.cuda_steps.graphs
    if not graphs:
        runner.cuda_steps.graphs = {}
    try:
        return _decode_logits(runner, ids, first)
    finally:
        runner.cuda_steps.graphs = saved


def _decode_logits(runner, ids: list[int], first: int) -> torch.Tensor:
    seq = Sequence(list(ids[:first]))
    seq.block_table = list(range(-(-len(ids) // runner.block_size)))
    rows = [runner.execute([ScheduledSeq(seq, first, 1)])[0].logits[-1].clone()]
    seq.num_computed_tokens = first
    for token in ids[first:-1]:
        seq.append_token(token)
        rows.append(runner.execute([ScheduledSeq(seq, 1, 1)])[0].logits[-1].clone())  # graph output: copy
        seq.num_computed_tokens += 1
    return torch.stack(rows).float()


# --- sections --------------------------------------------------------------------------------------------


def section_kernels() -> None:
    from backends.local_engine.config import DEFAULT_KERNELS
    from backends.local_engine.model import attention_cuda
    from bench.engine_gpu_kernels import check_kernels, pick_attention, pick_bf16_gemv, pick_quant

    results = check_kernels()
    for key, value in results.items():
        record("kernels", key, value)
    choice = os.environ.get("LLMGW_ATTENTION_KERNEL") or pick_attention(results)
    attention_cuda.use_kernel(choice)
    record("kernels", "attention kernel used", choice)
    os.environ["LLMGW_BF16_GEMV"] = os.environ.get("LLMGW_BF16_GEMV") or pick_bf16_gemv(results)
    record("kernels", "bf16 Triton GEMV at batch 1", os.environ["LLMGW_BF16_GEMV"])
    for fmt in ("int8", "int4"):
        variable = f"LLMGW_{fmt.upper()}_KERNEL"
        os.environ[variable] = os.environ.get(variable) or pick_quant(results, fmt, getattr(DEFAULT_KERNELS, f"{fmt}_cuda_kernel"))
        record("kernels", f"{fmt} kernel used", os.environ[variable])


def shape_section(shape: str, only: set[str], bandwidth: float, formats: tuple[str, ...] = FORMATS) -> None:
    """Every measurement of one shape, building and freeing models so that at most ~2 are resident."""
    hf = build_hf(shape, torch.device("cuda"), torch.float32)
    vocab = hf.config.vocab_size
    reference: list[list[int]] = []
    if "correct" in only:
        prompts = random_prompts(4, 48, 64, vocab, 11)
        reference = [p + out for p, out in zip(prompts, hf_static(hf, prompts, 1, 32), strict=True)]
        ref_logits = [hf_logits(hf, ids)[len(ids) - 33 : -1] for ids in reference]
        ours = build_ours(hf, shape, "fp32", 4, 512)
        ours_rows = [teacher_forced_logits(ours, ids, len(ids) - 32) for ids in reference]
        prefill = max(float((row - ref).abs().max()) for row, ref in zip(ours_rows, ref_logits, strict=True))
        decode = max(float((decode_logits(ours, ids, len(ids) - 32) - ref).abs().max())
                     for ids, ref in zip(reference[:2], ref_logits[:2], strict=True))  # fmt: skip
        eager = max(float((decode_logits(ours, ids, len(ids) - 32, graphs=False) - ref).abs().max())
                    for ids, ref in zip(reference[:1], ref_logits[:1], strict=True))  # fmt: skip
        record(
            shape,
            "fp32 max |logit diff| vs HF (prefill, decode graph, decode eager)",
            [prefill, decode, eager],
        )
        record(shape, "fp32 logit scale (max |logit|)", float(max(r.abs().max() for r in ref_logits)))
        hf_decode = max(float((hf_decode_logits(hf, ids, len(ids) - 32) - ref).abs().max())
                        for ids, ref in zip(reference[:2], ref_logits[:2], strict=True))  # fmt: skip
        record(shape, "HF fp32 own decode (KV cache) vs HF prefill: max |logit diff|", hf_decode)
        ours.free()
        record(shape, "fp32 noise floor: max |logit diff| vs HF in float64 (HF fp32, ours fp32)",
               float64_floor(hf, reference, ref_logits, ours_rows))  # fmt: skip
    for fmt in formats:
        try:
            ours_format(hf, shape, fmt, only, bandwidth, reference, ref_logits if reference else [])
        except Exception as error:  # keep the other formats' numbers
            import traceback

            traceback.print_exc()
            record(shape, f"ours {fmt} error", repr(error))
        gc.collect()
        torch.cuda.empty_cache()
    hf_section(hf, shape, only, bandwidth, reference, ref_logits if reference else [])
    del hf
    gc.collect()
    torch.cuda.empty_cache()


def float64_floor(
    hf, reference: list[list[int]], ref_logits: list[torch.Tensor], ours_rows: list[torch.Tensor]
) -> list[float]:
    """How far HF's own fp32 logits are from the same model in float64 (the rounding floor of fp32 at this
    depth), beside ours; hf goes back to fp32 after (fp32 → fp64 → fp32 is exact)."""
    hf.double()
    try:
        exact = [hf_logits(hf, ids, torch.float64)[len(ids) - 33 : -1] for ids in reference]
        return [
            max(float((r.double() - e).abs().max()) for r, e in zip(rows, exact, strict=True))
            for rows in (ref_logits, ours_rows)
        ]
    finally:
        hf.float()


def ours_format(hf, shape: str, fmt: str, only: set[str], bandwidth: float, reference, ref_logits) -> None:
    vocab = hf.config.vocab_size
    seqs = max(CLIENTS) if fmt == "bf16" and only & {"clients", "prefix"} else 4
    ours = build_ours(hf, shape, fmt, seqs, 16384 if "8b" in shape else 6144)
    if reference:
        record(shape, f"ours {fmt} greedy agreement vs fp32", agreement(ours, reference, ref_logits))
    if "decode" in only:
        runs = batch1_decode(ours, vocab)
        tok_s, nbytes = statistics.median(runs), decode_bytes(ours.runner)
        record(shape, f"ours {fmt} batch-1 decode", {
            "tok_s": tok_s, "decode_bytes": nbytes, "roofline_tok_s": bandwidth / nbytes,
            "pct_roofline": 100 * tok_s * nbytes / bandwidth, "runs_tok_s": runs,
        })  # fmt: skip
    if fmt == "bf16" and "clients" in only:
        for clients in CLIENTS:
            prompts = random_prompts(2 * clients, 96, 160, vocab, clients)
            record(shape, f"ours bf16 {clients} clients", run_closed_loop(ours, prompts, clients, NEW_TOKENS))
    if fmt == "bf16" and "prefix" in only:
        record(shape, "ours bf16 prefix TTFT", prefix_ttft(ours, vocab))
    ours.free()


def hf_section(hf, shape: str, only: set[str], bandwidth: float, reference, ref_logits) -> None:
    vocab = hf.config.vocab_size
    hf = hf.to(torch.bfloat16)
    torch.cuda.empty_cache()
    if reference:
        rows = [hf_logits(hf, ids)[len(ids) - 33 : -1] for ids in reference]
        record(shape, "HF bf16 greedy agreement vs fp32", agreement_of(rows, reference, ref_logits))
    if "decode" in only:
        prompt = random_prompts(1, 128, 128, vocab, 7)
        hf_static(hf, prompt, 1, 8)  # warm-up
        one = timed(lambda hf=hf: hf_static(hf, prompt, 1, 1))
        many = timed(lambda hf=hf: hf_static(hf, prompt, 1, 65))
        tok_s = 64 / (many - one)
        nbytes = hf_decode_bytes(hf)
        record(
            shape,
            "HF bf16 batch-1 decode",
            {"tok_s": tok_s, "pct_roofline": 100 * tok_s * nbytes / bandwidth},
        )
    if "clients" in only:
        for clients in CLIENTS:
            prompts = random_prompts(2 * clients, 96, 160, vocab, clients)
            seconds = timed(
                lambda prompts=prompts, clients=clients: hf_static(hf, prompts, clients, NEW_TOKENS)
            )
            record(
                shape, f"HF static {clients} clients", {"output_tok_s": len(prompts) * NEW_TOKENS / seconds}
            )


def agreement(ours: Ours, reference: list[list[int]], ref_logits: list[torch.Tensor]) -> dict:
    rows = [teacher_forced_logits(ours, ids, len(ids) - 32) for ids in reference]
    return agreement_of(rows, reference, ref_logits)


def agreement_of(
    rows: list[torch.Tensor], reference: list[list[int]], ref_logits: list[torch.Tensor]
) -> dict:
    """Top-1 agreement with the fp32 reference's greedy tokens and the largest logit difference."""
    hits = sum(
        int((r.argmax(-1).cpu() == torch.tensor(ids[-32:])).sum())
        for r, ids in zip(rows, reference, strict=True)
    )
    diff = max(float((r.float() - ref).abs().max()) for r, ref in zip(rows, ref_logits, strict=True))
    return {"top1_agreement": hits / (32 * len(reference)), "max_logit_diff": diff}


def prefix_ttft(ours: Ours, vocab: int, seed: int = 21) -> dict:
    """Cold: every request brings a new 1024-token prefix. Cached: the same prefix, a new 32-token tail.
    Prompts come from `seed` and seed + 1: a second call with the same seed finds its "cold" prefixes cached."""
    prefixes = random_prompts(6, 1024, 1024, vocab, seed)
    tails = random_prompts(6, 32, 32, vocab, seed + 1)
    ttft(ours, prefixes[0] + tails[0])  # warm-up of the prefill shapes
    cold = [ttft(ours, prefix + tail) for prefix, tail in zip(prefixes[1:], tails[1:], strict=True)]
    cached = [ttft(ours, prefixes[1] + tail) for tail in tails[1:]]
    cold_ms, cached_ms = 1e3 * statistics.median(cold), 1e3 * statistics.median(cached)
    return {"cold_ms": cold_ms, "cached_ms": cached_ms, "speedup": cold_ms / cached_ms}


def summary() -> list[str]:
    lines = ["", "=== engine_gpu summary ===", f"device: {RESULTS['device']}  copy bw: "
             f"{RESULTS['sections'].get('bw', {}).get('copy_GBps', 0):.0f} GB/s"]  # fmt: skip
    for shape, values in RESULTS["sections"].items():
        if shape in ("bw", "kernels"):
            continue
        lines.append(f"--- {shape}")
        for key, value in values.items():
            text = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items()) \
                if isinstance(value, dict) else json.dumps(value)  # fmt: skip
            lines.append(f"  {key:48s} {text}")
    if "kernels" in RESULTS["sections"]:
        lines.append("--- kernels")
        lines += [f"  {k:48s} {json.dumps(v)}" for k, v in RESULTS["sections"]["kernels"].items()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="bw,kernels,decode,clients,prefix,correct")
    parser.add_argument("--formats", default=",".join(FORMATS), help="weight formats of ours measured")
    parser.add_argument("--shapes", default="llama-1b,llama-8b,qwen2-0.5b")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = parser.parse_args()
    only = set(args.only.split(","))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    RESULTS["device"] = torch.cuda.get_device_name()
    RESULTS["args"] = vars(args)
    bandwidth = copy_bandwidth()
    record("bw", "copy_GBps", bandwidth / 1e9)
    if "kernels" in only:
        try:
            section_kernels()
        except Exception as error:
            import traceback

            traceback.print_exc()
            record("kernels", "error", repr(error))
    for shape in args.shapes.split(","):
        try:
            shape_section(shape, only, bandwidth, tuple(args.formats.split(",")))
        except Exception as error:  # keep the other shapes' numbers
            import traceback

            traceback.print_exc()
            record(shape, "error", repr(error))
        sync()
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "engine_gpu.json").write_text(json.dumps(RESULTS, indent=1))
    print("\n".join(summary()), flush=True)


if __name__ == "__main__":
    main()
