"""Production traces for replay (issue 43): load, slice, scale, write for AIPerf, and the two hit-rate bounds.

Traces (../shared/traces/SOURCE.md; read in place):
- Mooncake FAST'25 conversation trace (kvcache-ai/Mooncake, Apache-2.0): `timestamp` (ms), `input_length`,
  `output_length`, `hash_ids` of the prompt's 512-token blocks (equal ids = equal blocks = shared prefix).
- Azure LLM inference trace 2023, conv and code (Azure/AzurePublicDataset, CC-BY 4.0; Patel et al.,
  "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024): timestamps, context and
  generated tokens, no prefix information (its cache bound is 0).

Scaling keeps the prefix structure: lengths ÷ k and the block ÷ k (512 → 512/k tokens per hash id), so a
scaled prompt has the same hash ids and the same shared blocks; time × f stretches (f > 1) or compresses
the arrival gaps. The bounds are computed on the scaled slice, in prompt tokens (the engine's
`vllm:prefix_cache_hits_total / queries_total` unit):
- infinite cache: a block hits when its id was seen before, leading run only (prefix caching);
- best assignment: R replicas, each an LRU of its real KV capacity in blocks; each request goes to the
  replica holding its longest cached prefix among those under the same bounded-load cap the gateway uses
  ((1+ε) × mean, or mean + slack), least loaded on ties: a greedy oracle that knows every replica's true
  cache, the ceiling a router can reach by assignment alone (greedy, so not a proven optimum).
"""

import csv
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
FILES = {
    "mooncake": "mooncake_conversation_trace.jsonl",
    "azure_conv": "azure_llm_2023_conv.csv",
    "azure_code": "azure_llm_2023_code.csv",
}
BLOCK_TOKENS = 512  # Mooncake's hash block


@dataclass(frozen=True)
class TraceRequest:
    t_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def load(name: str, folder: Path = TRACES) -> list[TraceRequest]:
    path = folder / FILES[name]
    if name == "mooncake":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [
            TraceRequest(float(r["timestamp"]), int(r["input_length"]), int(r["output_length"]),
                         tuple(r.get("hash_ids", ())))
            for r in rows
        ]  # fmt: skip
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    stamps = [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in rows]
    first = min(stamps)
    return [
        TraceRequest((s - first).total_seconds() * 1000, int(r["ContextTokens"]), int(r["GeneratedTokens"]))
        for s, r in zip(stamps, rows, strict=True)
    ]


def window(requests: list[TraceRequest], start_s: float, duration_s: float) -> list[TraceRequest]:
    """The requests arriving in [start, start + duration) seconds of the trace, re-timed from 0."""
    lo, hi = start_s * 1000, (start_s + duration_s) * 1000
    picked = [r for r in requests if lo <= r.t_ms < hi]
    return [replace(r, t_ms=r.t_ms - lo) for r in picked]


def sample_sessions(requests: list[TraceRequest], span_s: float, one_in: int) -> list[TraceRequest]:
    """Requests of the first `span_s` seconds whose conversation is kept: about one conversation in
    `one_in`, chosen by a hash of its first block after the shared system block (hash_ids[1]), so every
    turn of a kept conversation stays and so does the prefix sharing between them. Short time windows
    lose it (a 60-request window of the Mooncake conversation trace has an infinite-cache bound of 5-9 %
    against 37 % for the whole trace), since turns of one conversation are minutes apart. Requests with
    one block or none (Azure) are kept one in `one_in` by their index."""
    kept = []
    for i, r in enumerate(requests):
        if r.t_ms >= span_s * 1000:
            continue
        key = f"c{r.hash_ids[1]}" if len(r.hash_ids) > 1 else f"r{i}"  # one-block prompts: by request
        if int(hashlib.blake2b(key.encode(), digest_size=8).hexdigest(), 16) % one_in == 0:
            kept.append(r)
    return kept


def scale(
    requests: list[TraceRequest], length_div: int, time_factor: float, max_input: int | None = None
) -> list[TraceRequest]:
    """Lengths ÷ length_div (at least 1 token; inputs at least one block's worth kept consistent with the
    hash ids), times × time_factor; inputs over max_input (after scaling) are cut to whole blocks."""
    block = BLOCK_TOKENS // length_div
    out = []
    for r in requests:
        length = max(1, round(r.input_length / length_div))
        ids = r.hash_ids
        if ids:  # AIPerf needs (ids - 1) whole blocks and a last block of 1..block tokens
            length = min(max(length, (len(ids) - 1) * block + 1), len(ids) * block)
        if max_input and length > max_input:
            keep = max(1, max_input // block) if ids else 0
            ids, length = ids[:keep], min(max_input, keep * block) if ids else max_input
        out.append(
            TraceRequest(r.t_ms * time_factor, length, max(1, round(r.output_length / length_div)), ids)
        )
    return out


def retime(requests: list[TraceRequest], factor: float) -> list[TraceRequest]:
    """Arrival times × factor (> 1 stretches, < 1 compresses); lengths and hash ids untouched."""
    return [replace(r, t_ms=r.t_ms * factor) for r in requests]


def write_mooncake(requests: list[TraceRequest], path: Path) -> Path:
    """AIPerf's `mooncake_trace` format: one JSON object per line (timestamp in ms)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for r in requests:
        row: dict = {
            "timestamp": round(r.t_ms),
            "input_length": r.input_length,
            "output_length": r.output_length,
        }
        if r.hash_ids:
            row["hash_ids"] = list(r.hash_ids)
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def _cached_tokens(r: TraceRequest, hits: int, block: int) -> int:
    """Tokens of the prompt covered by its first `hits` blocks (the last block may be partial)."""
    return min(hits * block, r.input_length)


def infinite_cache_uncached(requests: list[TraceRequest], block: int) -> list[int]:
    """Per request, the prompt tokens a cache that never evicts could not serve (after the leading run of
    blocks seen before): what it must prefill however it is routed."""
    seen: set[int] = set()
    out = []
    for r in requests:
        run = 0
        for h in r.hash_ids:
            if h not in seen:
                break
            run += 1
        out.append(r.input_length - _cached_tokens(r, run, block))
        seen.update(r.hash_ids)
    return out


def infinite_cache_hit_rate(requests: list[TraceRequest], block: int) -> float:
    """Share of prompt tokens whose block (leading run only) was seen before, with a cache that never evicts."""
    total = sum(r.input_length for r in requests)
    return (total - sum(infinite_cache_uncached(requests, block))) / total if total else 0.0


class LruBlocks:
    """One replica's prefix cache: at most `capacity` blocks, least recently used evicted first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def match(self, ids: tuple[int, ...]) -> int:
        run = 0
        for h in ids:
            if h not in self.blocks:
                break
            run += 1
        return run

    def admit(self, ids: tuple[int, ...]) -> None:
        for h in ids[-self.capacity :] if self.capacity else ():
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


def best_assignment_hit_rate(
    requests: list[TraceRequest], replicas: int, capacity_blocks: int, block: int,
    epsilon: float = 0.25, slack: float = 2.0,
) -> dict:  # fmt: skip
    """The greedy oracle (module docstring): hit rate and per-replica request counts."""
    caches = [LruBlocks(capacity_blocks) for _ in range(replicas)]
    counts = [0] * replicas
    hit = total = 0
    for i, r in enumerate(requests):
        mean = (i + 1) / replicas
        cap = max((1 + epsilon) * mean, mean + slack)
        allowed = [k for k in range(replicas) if counts[k] + 1 <= cap] or list(range(replicas))
        best = max(allowed, key=lambda k: (caches[k].match(r.hash_ids), -counts[k]))
        hit += _cached_tokens(r, caches[best].match(r.hash_ids), block)
        total += r.input_length
        caches[best].admit(r.hash_ids)
        counts[best] += 1
    return {"hit_rate": hit / total if total else 0.0, "requests_per_replica": counts}


def batch1_work(requests: list[TraceRequest], cal: dict[str, float]) -> float:
    """Seconds the requests take one at a time (`cal`: seconds per prompt and per output token)."""
    return sum(
        r.input_length * cal["s_per_prompt_token"] + r.output_length * cal["s_per_output_token"]
        for r in requests
    )


def describe(requests: list[TraceRequest]) -> dict:
    """Counts, span and medians of a (scaled) slice."""
    if not requests:
        return {"requests": 0}
    ins = sorted(r.input_length for r in requests)
    outs = sorted(r.output_length for r in requests)
    span = (requests[-1].t_ms - requests[0].t_ms) / 1000
    return {
        "requests": len(requests), "span_s": span, "rate_per_s": len(requests) / span if span else None,
        "input_p50": ins[len(ins) // 2], "input_p90": ins[int(len(ins) * 0.9)], "input_max": ins[-1],
        "output_p50": outs[len(outs) // 2], "output_p90": outs[int(len(outs) * 0.9)],
        "input_tokens": sum(ins), "output_tokens": sum(outs),
    }  # fmt: skip
