"""Our engine on one GPU beside HF transformers (issue 17), random-weight Llama-3 1B / 8B and Qwen2 shapes.

    python3 -m bench.engine_gpu [--only bw,kernels,decode,clients,prefix,correct] [--shapes llama-1b,llama-8b]
        [--out DIR]
    python3 -m bench.engine_gpu triton [--shape 8b|1b] [--sweep] [--dry-run]

`triton` times the kernels/ package's Triton kernels alone per Llama-3 shape (µs, GB/s, % of copy bandwidth;
bench/lib/engine_kernels.py, its own table and engine_kernels_<shape>.json; --dry-run: tiny shapes on the CPU
through Triton's interpreter).

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
import sys
import time
from pathlib import Path

import torch

from backends.local_engine.engine.sampling_params import SamplingParams
from bench.lib.engine_gpu_agreement import (
    agreement,
    decode_logits,
    float64_floor,
    hf_agreement,
    hf_to_bf16,
    long_reference,
    rope_buffers,
    set_rope_buffers,
    teacher_forced_logits,
)
from bench.lib.engine_gpu_models import (
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


# --- sections --------------------------------------------------------------------------------------------


def section_kernels(given: dict) -> dict:
    """Check the kernels and choose the engine's KernelSettings fields for the rest of the run: the exact
    default per operation (bench/lib/engine_gpu_kernels.py), unless `given` (--kernels) names one."""
    from backends.local_engine.config import DEFAULT_KERNELS
    from bench.lib.engine_gpu_kernels import check_kernels, pick_attention, pick_bf16_gemv, pick_quant

    results = check_kernels()
    for key, value in results.items():
        record("kernels", key, value)
    chosen = {"attention_kernel": pick_attention(results), "bf16_gemv": pick_bf16_gemv(results)}
    for fmt in ("int8", "int4"):
        name = f"{fmt}_cuda_kernel"
        chosen[name] = pick_quant(results, fmt, getattr(DEFAULT_KERNELS, name))
    chosen.update(given)
    record("kernels", "KernelSettings used", chosen)
    return chosen


def shape_section(
    shape: str, only: set[str], bandwidth: float, formats: tuple[str, ...], kernels: dict
) -> None:
    """Every measurement of one shape, building and freeing models so that at most ~2 are resident."""
    hf = build_hf(shape, torch.device("cuda"), torch.float32)
    vocab = hf.config.vocab_size
    refs: dict[str, tuple[list[list[int]], list[torch.Tensor], int]] = {}  # label -> (ids, fp32 logits, tail)
    if "correct" in only:
        prompts = random_prompts(4, 48, 64, vocab, 11)
        reference = [p + out for p, out in zip(prompts, hf_static(hf, prompts, 1, 32), strict=True)]
        ref_logits = [hf_logits(hf, ids)[len(ids) - 33 : -1] for ids in reference]
        refs["positions 48-95"] = (reference, ref_logits, 32)
        long = long_reference(hf, vocab)
        refs["positions 1024-1535"] = (long, [hf_logits(hf, ids)[len(ids) - 513 : -1] for ids in long], 512)
        ours = build_ours(hf, shape, "fp32", 4, 512, **kernels)
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
        for label, (ids, logits, tail) in refs.items():
            record(shape, f"ours fp32 greedy agreement vs fp32, {label}", agreement(ours, ids, logits, tail))
        ours.free()
        try:  # an 8B model in float64 (64 GB) may not fit an 80 GB card
            record(shape, "fp32 noise floor: max |logit diff| vs HF in float64 (HF fp32, ours fp32)",
                   float64_floor(hf, reference, ref_logits, ours_rows))  # fmt: skip
        except torch.cuda.OutOfMemoryError as error:
            hf.float()
            torch.cuda.empty_cache()
            record(shape, "fp32 noise floor error", repr(error)[:200])
    for fmt in formats:
        try:
            ours_format(hf, shape, fmt, only, bandwidth, refs, kernels)
        except Exception as error:  # keep the other formats' numbers
            import traceback

            traceback.print_exc()
            record(shape, f"ours {fmt} error", repr(error))
        gc.collect()
        torch.cuda.empty_cache()
    hf_section(hf, shape, only, bandwidth, refs)
    del hf
    gc.collect()
    torch.cuda.empty_cache()


def ours_format(
    hf, shape: str, fmt: str, only: set[str], bandwidth: float, refs: dict, kernels: dict
) -> None:
    vocab = hf.config.vocab_size
    seqs = max(CLIENTS) if fmt == "bf16" and only & {"clients", "prefix"} else 4
    ours = build_ours(hf, shape, fmt, seqs, 16384 if "8b" in shape else 6144, **kernels)
    for label, (ids, logits, tail) in refs.items():
        record(shape, f"ours {fmt} greedy agreement vs fp32, {label}", agreement(ours, ids, logits, tail))
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


def hf_section(hf, shape: str, only: set[str], bandwidth: float, refs: dict) -> None:
    """HF bf16, built from the fp32 reference with RoPE's inv_freq kept fp32 (bench/lib/engine_gpu_agreement.py);
    its agreement also with inv_freq rounded to bf16, as `hf.to(torch.bfloat16)` alone leaves it."""
    vocab = hf.config.vocab_size
    rope = rope_buffers(hf)
    hf = hf_to_bf16(hf, keep_rope_fp32=False)
    torch.cuda.empty_cache()
    for label, (ids, logits, tail) in refs.items():
        record(shape, f"HF bf16 (inv_freq rounded to bf16) greedy agreement vs fp32, {label}",
               hf_agreement(hf, ids, logits, tail))  # fmt: skip
    set_rope_buffers(hf, rope)
    for label, (ids, logits, tail) in refs.items():
        record(shape, f"HF bf16 greedy agreement vs fp32, {label}", hf_agreement(hf, ids, logits, tail))
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
    if sys.argv[1:2] == ["triton"]:
        from bench.lib.engine_kernels import main as triton_main  # reads --dry-run before triton is imported

        triton_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="bw,kernels,decode,clients,prefix,correct")
    parser.add_argument("--formats", default=",".join(FORMATS), help="weight formats of ours measured")
    parser.add_argument("--shapes", default="llama-1b,llama-8b,qwen2-0.5b")
    parser.add_argument(
        "--kernels", default="", help="KernelSettings fields over the checked choice, name=value,..."
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = parser.parse_args()
    from backends.local_engine.config import KernelSettings

    given = dict(item.split("=", 1) for item in args.kernels.split(",") if item)
    kernels = KernelSettings(**given).model_dump(include=set(given))  # typed and checked here, not mid-run
    only = set(args.only.split(","))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    RESULTS["device"] = torch.cuda.get_device_name()
    RESULTS["args"] = vars(args)
    bandwidth = copy_bandwidth()
    record("bw", "copy_GBps", bandwidth / 1e9)
    if "kernels" in only:
        try:
            kernels = section_kernels(kernels)
        except Exception as error:
            import traceback

            traceback.print_exc()
            record("kernels", "error", repr(error))
    for shape in args.shapes.split(","):
        try:
            shape_section(shape, only, bandwidth, tuple(args.formats.split(",")), kernels)
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
