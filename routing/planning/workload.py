"""A planning workload from a trace file (Mooncake JSONL or Azure CSV) or from stated figures (issue 43).

Kept apart from bench/lib/trace_data.py, which routing may not import; this reads only what planning needs:
arrival rate, input and output length mean and p90, and the infinite-cache hit rate when the trace carries
Mooncake hash ids (an upper bound on what prefix caching can save).
"""

import csv
import json
from datetime import datetime
from pathlib import Path

from routing.planning.capacity import Workload


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(len(ordered) * 0.9)] if ordered else 0.0


def workload_from_trace(
    path: Path, ttft_slo_s: float, itl_slo_s: float, time_factor: float = 1.0, length_div: float = 1.0,
    hit_rate: float | None = None, block_tokens: int = 512,
) -> Workload:  # fmt: skip
    """`time_factor` stretches the arrivals (2: half the rate); `length_div` divides every length.
    `hit_rate`: None takes the trace's infinite-cache hit rate (0 without hash ids)."""
    stamps, inputs, outputs, hits = [], [], [], 0.0
    seen: set[int] = set()
    if path.suffix == ".csv":
        with path.open() as handle:
            for row in csv.DictReader(handle):
                stamps.append(datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp())
                inputs.append(int(row["ContextTokens"]) / length_div)
                outputs.append(int(row["GeneratedTokens"]) / length_div)
    else:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            stamps.append(float(row["timestamp"]) / 1000)
            inputs.append(int(row["input_length"]) / length_div)
            outputs.append(int(row["output_length"]) / length_div)
            run = 0
            for block in row.get("hash_ids", []):
                if block not in seen:
                    break
                run += 1
            hits += min(run * block_tokens / length_div, inputs[-1])
            seen.update(row.get("hash_ids", []))
    span = (max(stamps) - min(stamps)) * time_factor or 1.0
    trace_hit = hits / sum(inputs) if inputs else 0.0
    return Workload(
        rate_per_s=len(stamps) / span, input_mean=sum(inputs) / len(inputs), output_mean=sum(outputs) / len(outputs),
        input_p90=_p90(inputs), hit_rate=trace_hit if hit_rate is None else hit_rate,
        ttft_slo_s=ttft_slo_s, itl_slo_s=itl_slo_s,
    )  # fmt: skip
