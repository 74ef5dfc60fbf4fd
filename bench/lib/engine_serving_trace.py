"""The measuring side of bench/engine_serving_gpu.py: an in-process open-loop driver of the engine, its step
trace (what each step computed and how long the device took), the per-step bound, request latencies and
goodput, and a profiled step-time breakdown.

Per-step bound (issue 45): a step reads the weights once plus the KV of every scheduled sequence (bytes over
the measured copy bandwidth), or does its FLOPs (matmuls, the logits rows, causal attention) at the measured
bf16 matmul rate, whichever is larger. The sum over the run's steps is the time the run could take at best
with the same schedule; the share reached is that sum over the measured wall time.
"""

import json
import statistics
import time
from dataclasses import dataclass, field

import torch

from backends.local_engine.engine.sampling_params import SamplingParams


@dataclass
class Ceilings:
    bandwidth: float  # bytes/s, a device-to-device copy counting bytes read and written
    flops: float  # bf16 matmul FLOP/s on random data


@dataclass
class ModelCost:
    weight_bytes: int  # what one step reads of the weights (bench.lib.engine_gpu_models.decode_bytes)
    kv_bytes_per_token: int  # K and V of one token, all layers
    layer_params: int  # matmul weights of the layer stack (no embedding, no output layer)
    logit_params: int  # the output layer's weights
    attn_width: int  # layers x query heads x head dim: one query-key pair costs 4 x this FLOPs (QK and PV)

    @classmethod
    def of(cls, runner, weight_bytes: int) -> "ModelCost":
        c = runner.config
        per_layer = c.hidden_size * (c.q_size + 2 * c.kv_size) + c.q_size * c.hidden_size
        per_layer += 3 * c.hidden_size * c.intermediate_size
        return cls(weight_bytes, runner.kv_bytes_per_token, c.num_layers * per_layer,
                   c.vocab_size * c.hidden_size, c.num_layers * c.q_size)  # fmt: skip


@dataclass
class Step:
    decode_seqs: int = 0
    prefill_seqs: int = 0
    prefill_tokens: int = 0
    kv_tokens: int = 0  # context tokens whose K/V the step reads (cached + new, every sequence)
    attn_pairs: int = 0  # causal query-key pairs
    logit_rows: int = 0
    gpu_ms: float = 0.0  # the model forward on the device (CUDA events around the runner)

    @property
    def kind(self) -> str:
        return "decode" if not self.prefill_tokens else ("mixed" if self.decode_seqs else "prefill")

    def floor_ms(self, cost: ModelCost, ceil: Ceilings) -> tuple[float, float]:
        """(memory floor, compute floor) in ms."""
        nbytes = cost.weight_bytes + self.kv_tokens * cost.kv_bytes_per_token
        tokens = self.decode_seqs + self.prefill_tokens
        flops = 2 * cost.layer_params * tokens + 2 * cost.logit_params * self.logit_rows
        flops += 4 * cost.attn_width * self.attn_pairs
        return 1e3 * nbytes / ceil.bandwidth, 1e3 * flops / ceil.flops


class StepTrace:
    """Records every scheduled step of `engine` (wrapping its scheduler and runner); `close` unwraps."""

    def __init__(self, engine) -> None:
        self.engine, self.steps = engine, []
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event, Step]] = []
        self._schedule, self._execute = engine.scheduler.schedule, engine.runner.execute
        engine.scheduler.schedule, engine.runner.execute = self._traced_schedule, self._traced_execute
        self._last: Step | None = None

    def _traced_schedule(self):
        out = self._schedule()
        step = Step()
        for item in out.scheduled:
            seq, n = item.seq, item.num_new_tokens
            start = seq.num_computed_tokens
            if n == 1 and start + 1 == len(seq.token_ids):
                step.decode_seqs += 1
            else:
                step.prefill_seqs += 1
                step.prefill_tokens += n
            step.kv_tokens += start + n
            step.attn_pairs += n * start + n * (n + 1) // 2
            step.logit_rows += item.num_logits if start + n == len(seq.token_ids) else 0
        if out.scheduled:
            self.steps.append(step)
        self._last = step if out.scheduled else None
        return out

    def _traced_execute(self, batch, input_tokens=None):
        if self._last is None or not torch.cuda.is_available():
            return self._execute(batch, input_tokens)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self._execute(batch, input_tokens)
        end.record()
        self._events.append((start, end, self._last))
        self._last = None
        return out

    def close(self) -> None:
        self.engine.scheduler.schedule, self.engine.runner.execute = self._schedule, self._execute
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        for start, end, step in self._events:
            step.gpu_ms = start.elapsed_time(end)
        self._events = []


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    arrival: float = 0.0  # seconds after the run's start
    priority: int = 0
    token_times: list[float] = field(default_factory=list)  # one per output token
    done: float | None = None


def serve(engine, requests: list[Request], temperature: float = 0.0, deadline_s: float = 600.0) -> float:
    """Replay `requests` (by arrival time) through the engine, stepping it in this thread; returns the wall
    seconds from the first arrival to the last token."""
    pending = sorted(requests, key=lambda r: r.arrival)
    by_id: dict[int, Request] = {}
    start = time.perf_counter()
    while pending or engine.has_work:
        now = time.perf_counter() - start
        while pending and pending[0].arrival <= now:
            request = pending.pop(0)
            params = SamplingParams(max_tokens=request.max_tokens, temperature=temperature, ignore_eos=True,
                                    priority=request.priority)  # fmt: skip
            by_id[engine.add_request(request.prompt, params)] = request
        if not engine.has_work:
            time.sleep(max(0.0, min(pending[0].arrival - now, 0.01)))
            continue
        outputs = engine.step()
        now = time.perf_counter() - start
        for out in outputs:
            request = by_id[out.seq_id]
            request.token_times += [now] * len(out.new_token_ids)
            if out.finish_reason is not None:
                request.done = now
        if now > deadline_s:
            raise TimeoutError(f"run past {deadline_s} s")
    return time.perf_counter() - start


def percentiles(values: list[float], points: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    if not values:
        return {f"p{p}": float("nan") for p in points}
    ordered = sorted(values)
    return {f"p{p}": ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] for p in points}


def request_metrics(requests: list[Request], slo_ttft_s: float, slo_itl_s: float) -> dict:
    """TTFT and ITL (ms) percentiles; goodput = requests whose TTFT and mean ITL meet the SLO (DistServe's)."""
    ttft = [r.token_times[0] - r.arrival for r in requests if r.token_times]
    itl = [b - a for r in requests for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
    good = 0
    for r in requests:
        if len(r.token_times) < r.max_tokens:
            continue
        mean_itl = (r.token_times[-1] - r.token_times[0]) / max(1, len(r.token_times) - 1)
        good += r.token_times[0] - r.arrival <= slo_ttft_s and mean_itl <= slo_itl_s
    return {
        "ttft_ms": {k: 1e3 * v for k, v in percentiles(ttft).items()},
        "itl_ms": {k: 1e3 * v for k, v in percentiles(itl).items()},
        "goodput_share": good / len(requests),
        "slo": {"ttft_s": slo_ttft_s, "mean_itl_s": slo_itl_s},
    }


def trace_metrics(
    steps: list[Step], cost: ModelCost, ceil: Ceilings, wall_s: float, output_tokens: int
) -> dict:
    """The bound and share over the run, and per kind of step: count, device ms p50, floor ratio."""
    bound_ms = mem_ms = 0.0
    kinds: dict[str, list[tuple[float, float, int]]] = {}
    for step in steps:
        mem, flop = step.floor_ms(cost, ceil)
        bound_ms += max(mem, flop)
        mem_ms += mem
        kinds.setdefault(step.kind, []).append((step.gpu_ms, max(mem, flop), step.decode_seqs))
    out = {
        "steps": len(steps),
        "bound_s": bound_ms / 1e3,
        "share_of_bound": bound_ms / 1e3 / wall_s,
        "bound_output_tok_s": output_tokens / (bound_ms / 1e3),
        "share_of_memory_only_bound": mem_ms / 1e3 / wall_s,
        "device_busy_share": sum(s.gpu_ms for s in steps) / 1e3 / wall_s,
    }
    for kind, rows in kinds.items():
        out[kind] = {"count": len(rows), "gpu_ms_p50": statistics.median(r[0] for r in rows),
                     "gpu_over_floor_p50": statistics.median(r[0] / r[1] for r in rows if r[1] > 0),
                     "gpu_ms_total_s": sum(r[0] for r in rows) / 1e3}  # fmt: skip
    near = [(g, f) for g, f, n in kinds.get("decode", []) if 112 <= n <= 144]
    if near:
        out["decode_128_seqs"] = {"count": len(near), "gpu_ms_p50": statistics.median(g for g, _ in near),
                                  "floor_ms_p50": statistics.median(f for _, f in near),
                                  "gpu_over_floor_p50": statistics.median(g / f for g, f in near)}  # fmt: skip
    return out


# --- step-time breakdown ------------------------------------------------------------------------------------

_KINDS = (
    ("attention", ("attention", "attn", "paged", "flash", "fmha", "sdpa", "decode_kernel")),
    ("matmul", ("gemm", "gemv", "matmul", "cutlass", "xmma", "nvjet", "skinny", "cublas", "sm90_", "wgmma")),
)


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    for kind, marks in _KINDS:
        if any(mark in lowered for mark in marks):
            return kind
    return "other kernels"


def profile_breakdown(
    engine, requests: list[Request], warm_steps: int, profiled_steps: int, path: str
) -> dict:
    """Time shares per step kind over `profiled_steps` steps of `requests` submitted at once, after
    `warm_steps` unprofiled ones: device time in attention, matmul and other kernels of the forward, in
    sampling (kernels after the forward), and host (the step's wall time not covered by kernels). Each
    profiled step is synchronized before and after and runs without CUDA graphs, so its kernels are visible
    one by one (the same kernels a graph replays; the host share is then an eager step's)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    runner = engine.runner
    graphs = runner.cuda_steps.graphs, runner.cuda_steps.prefill_graphs
    ids = [engine.add_request(r.prompt, SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True))
           for r in requests]  # fmt: skip
    for _ in range(warm_steps):
        engine.step()
    trace = StepTrace(engine)
    execute, kinds = runner.execute, []

    def marked_execute(batch, input_tokens=None):
        out = execute(batch, input_tokens)
        kinds.append(trace.steps[-1].kind if trace.steps else "unknown")
        torch.cuda.synchronize()
        with record_function("bench_model_done"):
            pass
        return out

    runner.execute = marked_execute
    runner.cuda_steps.graphs, runner.cuda_steps.prefill_graphs = {}, {}
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(profiled_steps):
                torch.cuda.synchronize()
                with record_function("bench_step"):
                    engine.step()
                    torch.cuda.synchronize()
        prof.export_chrome_trace(path)
    finally:
        runner.execute = execute
        runner.cuda_steps.graphs, runner.cuda_steps.prefill_graphs = graphs
        trace.close()
        for seq_id in ids:
            engine.abort(seq_id)
        while engine.has_work:
            engine.step()
    with open(path) as handle:
        events = json.load(handle)["traceEvents"]
    return _attribute(events, kinds)


def _attribute(events: list[dict], kinds: list[str]) -> dict:
    """Kernel time by part and the host's remainder, per step kind (`kinds`: one per forward, in order)."""
    host = [e for e in events if e.get("cat") == "user_annotation" and "dur" in e]  # not gpu_user_annotation
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in host if e["name"] == "bench_step")
    marks = sorted(e["ts"] for e in host if e["name"] == "bench_model_done")
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    totals: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    kinds = list(kinds)
    for begin, end in spans:
        done = next((m for m in marks if begin <= m <= end), None)
        if done is None:  # a step that only collected the tokens of the one before
            continue
        kind = kinds.pop(0) if kinds else "unknown"
        row = totals.setdefault(
            kind, {"attention": 0.0, "matmul": 0.0, "other kernels": 0.0, "sampling": 0.0}
        )
        busy = 0.0
        for k in kernels:
            if begin <= k["ts"] <= end:
                part = "sampling" if k["ts"] >= done else kernel_kind(k["name"])
                row[part] += k["dur"] / 1e3
                busy += k["dur"] / 1e3
        row["host"] = row.get("host", 0.0) + max(0.0, (end - begin) / 1e3 - busy)
        counts[kind] = counts.get(kind, 0) + 1
    return {kind: {"steps": counts[kind], "ms_per_step": {k: v / counts[kind] for k, v in row.items()},
                   "share": {k: v / max(1e-9, sum(row.values())) for k, v in row.items()}}
            for kind, row in totals.items()}  # fmt: skip
