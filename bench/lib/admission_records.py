"""AIPerf's per-request records read back for bench/admission_replay.py (issue 44): latency against a class's
SLO, refusals with or without Retry-After, timeouts, served tokens per time window, Jain's fairness index.

AIPerf writes one JSON object per request to `profile_export.jsonl` under its artifact dir: wall-clock
`metadata.request_start_ns` / `request_end_ns`, `metrics` (time_to_first_token, inter_token_latency in ms,
usage_prompt_tokens, usage_completion_tokens), `error` for a failed one ({code, type, message}), and with
`--export-http-trace` its `trace_data` (response status and headers: Retry-After).
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Record:
    start_s: float  # wall clock
    end_s: float
    status: str  # "200", "429", "503", "timeout", "cut_streaming", or the error's type
    ttft_ms: float | None
    itl_ms: float | None
    prompt_tokens: int  # served (0 when it failed)
    completion_tokens: int
    retry_after: str | None  # the response's Retry-After header, if any

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _value(metrics: dict[str, Any], tag: str) -> float | None:
    entry = metrics.get(tag)
    return float(entry["value"]) if isinstance(entry, dict) and entry.get("value") is not None else None


STREAMING_READS = 4  # more network reads than the headers and the role chunk: tokens were flowing


def _status(row: dict[str, Any], trace: dict[str, Any]) -> str:
    """A client timeout is "timeout" while nothing came (a wait: what the gateway must refuse instead) and
    "cut_streaming" when the answer was streaming (the client's total timeout shorter than the answer)."""
    error = row.get("error")
    if not error:
        return str(trace.get("response_status_code") or 200)
    kind = str(error.get("type") or "")
    if "timeout" in kind.lower() or (row.get("metadata") or {}).get("was_cancelled"):
        reads = int(trace.get("response_chunks_count") or 0)
        return "cut_streaming" if reads >= STREAMING_READS else "timeout"
    code = error.get("code") or trace.get("response_status_code")
    return str(code) if code else kind or "other"


def read_records(out: Path) -> list[Record]:
    found = sorted(out.rglob("profile_export.jsonl"))
    if not found:
        raise RuntimeError(f"no AIPerf records under {out}")
    records = []
    for line in found[-1].read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        meta, metrics = row.get("metadata") or {}, row.get("metrics") or {}
        trace = row.get("trace_data") or {}
        headers = {k.lower(): v for k, v in (trace.get("response_headers") or {}).items()}
        status = _status(row, trace)
        prompt = completion = 0
        if status == "200":
            prompt = int(
                _value(metrics, "usage_prompt_tokens") or _value(metrics, "input_sequence_length") or 0
            )
            completion = int(
                _value(metrics, "usage_completion_tokens") or _value(metrics, "output_sequence_length") or 0
            )
        records.append(
            Record(meta["request_start_ns"] / 1e9, meta["request_end_ns"] / 1e9, status,
                   _value(metrics, "time_to_first_token"), _value(metrics, "inter_token_latency"), prompt,
                   completion, headers.get("retry-after"))
        )  # fmt: skip
    return sorted(records, key=lambda r: r.start_s)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def met(record: Record, ttft_ms: float, itl_ms: float) -> bool:
    return (
        record.status == "200"
        and record.ttft_ms is not None
        and record.ttft_ms <= ttft_ms
        and (record.itl_ms or 0.0) <= itl_ms
    )


def summarise(records: list[Record], ttft_ms: float, itl_ms: float, window: tuple[float, float]) -> dict:
    """One tenant's figures: latency of its answered requests, goodput (share of all it sent that met the SLO),
    refusals by status and how many carried Retry-After, timeouts, and its served tokens/s over `window`."""
    ok = [r for r in records if r.status == "200"]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    refused: dict[str, dict[str, int]] = {}
    for r in records:
        if r.status != "200":
            entry = refused.setdefault(r.status, {"count": 0, "with_retry_after": 0})
            entry["count"] += 1
            entry["with_retry_after"] += r.retry_after is not None
    lo, hi = window
    served = sum(r.tokens for r in ok if lo <= r.end_s < hi)
    return {
        "sent": len(records),
        "answered": len(ok),
        "ttft_p50_ms": percentile(ttfts, 0.5),
        "ttft_p95_ms": percentile(ttfts, 0.95),
        "ttft_p99_ms": percentile(ttfts, 0.99),
        "itl_p50_ms": percentile([r.itl_ms for r in ok if r.itl_ms is not None], 0.5),
        "goodput": sum(met(r, ttft_ms, itl_ms) for r in records) / len(records) if records else 0.0,
        "refused": refused,
        "timeouts": refused.get("timeout", {}).get("count", 0),
        "cut_streaming": refused.get("cut_streaming", {}).get("count", 0),
        "served_tokens": served,
        "served_tok_s": served / (hi - lo) if hi > lo else 0.0,
        "first_start_s": records[0].start_s if records else None,
        "last_start_s": records[-1].start_s if records else None,
    }


def overlap(*tenants: list[Record]) -> tuple[float, float]:
    """The wall-clock span in which every tenant was sending: from the latest first request to the earliest
    last request."""
    return max(t[0].start_s for t in tenants), min(t[-1].start_s for t in tenants)


def served_windows(records: list[Record], start: float, end: float, width: float) -> list[int]:
    """Tokens of the requests that ended in each whole `width`-second window of [start, end)."""
    count = int((end - start) // width)
    windows = [0] * count
    for r in records:
        index = int((r.end_s - start) // width)
        if r.status == "200" and r.end_s >= start and index < count:
            windows[index] += r.tokens
    return windows


def jain(values: list[float]) -> float:
    """Jain's fairness index: (Σx)² / (n Σx²); 1 = equal shares, 1/n = one takes all."""
    square = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * square) if square else 1.0
