"""bench/admission_replay.py's trace slices: a window of a trace from a start second, its lengths scaled, cut to
a load of the pool's measured capacity over a span, keeping the trace's own arrival pattern."""

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from bench.lib import trace_data as td


class SlicePool(Protocol):
    """What a slice needs of the pool: the run's arguments, the batch-1 calibration, the measured capacity."""

    args: argparse.Namespace
    cal: dict[str, float]
    capacity: dict[str, float]


def scaled(name: str, args: argparse.Namespace, start_s: float) -> tuple[list[td.TraceRequest], int]:
    """Trace `name` from `start_s` (an hour of it), lengths scaled, answers cut at --max-output (a prompt cut
    at --max-input with a longer answer would pass the engines' max_model_len: a 400); the divisor used."""
    div = args.length_div if name == "mooncake" else args.azure_length_div
    requests = td.scale(
        td.window(td.load(name, Path(args.traces_dir)), start_s, 3600), div, 1.0, args.max_input
    )
    return [replace(r, output_length=min(r.output_length, args.max_output)) for r in requests], div


def fit(name: str, pool: SlicePool, start_s: float, load: float, duration_s: float,
        offset_s: float = 0.0) -> tuple[list[td.TraceRequest], int]:  # fmt: skip
    """Trace `name` from its first request at or after `start_s`, cut to load × the pool's measured capacity ×
    `duration_s` of batch-1 work, keeping its own arrival pattern: a window of native time (`duration_s`,
    longer when that holds too little work, then compressed to `duration_s`), thinned evenly by index to the
    work wanted (one request in k). Thinning, not stretching a run of consecutive requests: the Mooncake trace
    stamps its arrivals in 3 s ticks of about 10 requests, which stretching would turn into bursts of 10.
    Where the rest of the trace holds less work than that, all of it is compressed into `duration_s` (a
    lower load: `slice_load` reports it, with a warning). Shifted by `offset_s`; with the length divisor."""
    requests, div = scaled(name, pool.args, start_s)
    if not requests:
        raise SystemExit(f"{name} has no request after second {start_s}: choose an earlier --start-s")
    first = requests[0].t_ms  # a gap at the window's start (the Azure code trace has ~2 min ones) is skipped
    requests = [replace(r, t_ms=r.t_ms - first) for r in requests]
    budget, span, end = load * pool.capacity["work_rate"] * duration_s, duration_s, requests[-1].t_ms / 1000
    while True:
        window = [r for r in requests if r.t_ms < span * 1000]
        total = td.batch1_work(window, pool.cal)
        if total >= budget or len(window) == len(requests):
            break
        span = min(span * (budget / total * 1.05 if total else 2.0), end + 1e-3)  # never past the trace's end
    k = max(total / budget, 1.0)
    kept = [r for index, r in enumerate(window) if int((index + 1) / k) > int(index / k)]
    reached = _load(kept, pool, duration_s)
    if reached < 0.95 * load:
        print(f"warning: {name} from second {start_s} holds load {reached:.2f} over {duration_s:.0f} s, "
              f"not {load}: the trace ends (choose an earlier --start-s for the full load)")  # fmt: skip
    factor = duration_s / span
    return [replace(r, t_ms=r.t_ms * factor + offset_s * 1000) for r in kept], div


def slice_load(trace: list[td.TraceRequest], pool: SlicePool, duration_s: float) -> dict[str, Any]:
    """A slice's description with the load it offers."""
    return {**td.describe(trace), "load": _load(trace, pool, duration_s)}


def _load(trace: list[td.TraceRequest], pool: SlicePool, duration_s: float) -> float:
    """Batch-1 work of `trace` ÷ the pool's measured capacity over `duration_s`."""
    return td.batch1_work(trace, pool.cal) / (pool.capacity["work_rate"] * duration_s)
