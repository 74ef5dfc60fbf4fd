"""AIPerf's command line for a trace replay, and its results read back (issue 43; bench/trace_replay.py).

AIPerf runs from its own venv (build/aiperf-venv: `python3 -m venv build/aiperf-venv &&
build/aiperf-venv/bin/pip install aiperf==0.13.0`, the version pinned in pyproject's `trace` extra) and reads
SmolLM2's tokenizer from an HF cache in build/hf-cache (`python -m bench.lib.trace_aiperf`).
"""

import argparse
import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.lib.harness import HF_CACHE

TOKENIZER_REPO = "HuggingFaceTB/SmolLM2-135M"  # the packaged GGUF's tokenizer is this repo's
ALL_FAILED = (
    "inference request(s) failed; no successful responses"  # AIPerf 0.13 exits 1 then, records written
)


def aiperf_command(
    args: argparse.Namespace, url: str, key: str, trace_file: Path, out: Path, seed: int
) -> list[str]:
    goodput = f"time_to_first_token:{args.slo_ttft_ms} inter_token_latency:{args.slo_itl_ms}"
    # AIPerf 0.13's prompt-decoding workers force HF_HUB_OFFLINE and then look the tokenizer up as a Hub repo
    # in the HF cache, so a plain local folder fails there: the tokenizer is laid out as a cached Hub repo
    # (export_tokenizer) and named by its repo id, offline throughout
    return [
        "env", "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", f"HF_HUB_CACHE={args.tokenizer}", *shlex.split(args.aiperf), "profile", "--model", "pool", "--url", url, "--endpoint-type", "completions", "--streaming",
        "--input-file", str(trace_file), "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
        "--isl-block-size", str(512 // args.length_div), "--tokenizer", TOKENIZER_REPO, "--api-key", key,
        "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0", "--use-legacy-max-tokens",
        "--goodput", goodput, "--artifact-dir", str(out), "--ui-type", "none", "--random-seed", str(seed),
        "--workers-max", "4", "--request-timeout-seconds", str(args.aiperf_timeout_s),
    ]  # fmt: skip


def run_aiperf(command: list[str], timeout_s: float) -> float:
    """Runs AIPerf to its end, once more if it failed within a minute (while starting its services, on a loaded
    box); the wall seconds of the run that finished. A run whose every request failed (timeouts, refusals) has
    finished: its records say how."""
    for attempt in range(2):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        wall = time.perf_counter() - start
        if done.returncode == 0 or ALL_FAILED in done.stdout + done.stderr:  # it ran; every request failed
            return wall
        if attempt == 0 and wall < 60:
            print(f"aiperf failed to start, retrying: {done.stdout[-600:]}", flush=True)
            continue
        raise RuntimeError(f"aiperf failed ({done.returncode}): {done.stderr[-2000:]}{done.stdout[-2000:]}")
    raise AssertionError("unreachable")


def _metric(summary: dict, tag: str, stat: str) -> float:
    value = summary.get(tag) or {}
    return float(value.get(stat) or 0.0) if isinstance(value, dict) else 0.0


def read_aiperf(out: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """The summary (ms, tok/s, goodput share) and the failed requests by HTTP status."""
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if not found:
        raise RuntimeError(f"no AIPerf summary under {out}")
    data = json.loads(found[-1].read_text())
    metrics = data.get("records") or data
    requests = _metric(metrics, "request_count", "avg")
    good = _metric(metrics, "good_request_count", "avg")
    summary = {
        "requests": requests,
        "ttft_p50_ms": _metric(metrics, "time_to_first_token", "p50"),
        "ttft_p90_ms": _metric(metrics, "time_to_first_token", "p90"),
        "ttft_p99_ms": _metric(metrics, "time_to_first_token", "p99"),
        "itl_p50_ms": _metric(metrics, "inter_token_latency", "p50"),
        "itl_p90_ms": _metric(metrics, "inter_token_latency", "p90"),
        "itl_p99_ms": _metric(metrics, "inter_token_latency", "p99"),
        "e2e_p50_ms": _metric(metrics, "request_latency", "p50"),
        "e2e_p90_ms": _metric(metrics, "request_latency", "p90"),
        "e2e_p99_ms": _metric(metrics, "request_latency", "p99"),
        "output_tok_s": _metric(metrics, "output_token_throughput", "avg"),
        "total_tok_s": (_metric(metrics, "total_isl", "avg") + _metric(metrics, "total_osl", "avg"))
        / max(_metric(metrics, "benchmark_duration", "avg"), 1e-9),
        "goodput_rps": _metric(metrics, "goodput", "avg"),
    }
    errors: dict[str, int] = {}
    for line in (
        (found[-1].parent / "profile_export.jsonl").read_text().splitlines()
        if (found[-1].parent / "profile_export.jsonl").exists()
        else []
    ):
        record = json.loads(line)
        error = record.get("error")
        if error:
            code = str(error.get("code") or error.get("type") or "other")
            errors[code] = errors.get(code, 0) + 1
    sent = requests + sum(errors.values())  # AIPerf's request_count counts the answered ones
    summary["goodput_share"] = good / sent if sent else 0.0  # share of all requests that met the SLO
    return summary, errors


def export_tokenizer(cache: Path = HF_CACHE) -> Path:
    """SmolLM2's tokenizer.json (from the packaged GGUF) laid out as HF-cached snapshot of TOKENIZER_REPO,
    with a tokenizer_config.json that transformers' AutoTokenizer reads."""
    from bench.lib.engine_pool import export_tokenizer as write_tokenizer_json

    repo = cache / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / "llmgw-gguf"
    write_tokenizer_json(snapshot)
    (snapshot / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
    )
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text("llmgw-gguf")
    return snapshot


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--export-tokenizer", default=str(HF_CACHE), help="the HF cache folder to write")
    print(export_tokenizer(Path(parser.parse_args().export_tokenizer)))
