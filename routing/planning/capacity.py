"""Capacity planning arithmetic (issue 43): KV bytes per token, sequences that fit, throughput at an SLO,
replicas needed.

The seed's arithmetic: GPUs = (weights + KV cache per sequence × concurrent sequences) ÷ memory per GPU,
with KV bytes per token = 2 (K and V) × layers × KV heads × head size × bytes per element. For a Llama-2/3-70B
shape (80 layers, 8 KV heads, head size 128, fp16) that is 2·80·8·128·2 = 327,680 B = 320 KiB per token,
2.5 GiB per 8,192-token sequence; four 80 GB GPUs less 140 GB of fp16 weights leave 180 GB, room for 67 such
sequences (tests/test_plan.py).

Throughput comes from a step-time model of the engine (StepModel): a decode step costs a fixed time plus
the time to read the weights and every running sequence's KV cache once at an effective bandwidth; prefill
costs a time per uncached prompt token. Its constants come from a GPU's datasheet bandwidth and FLOPs
(roofline, `StepModel.roofline`) or, better, from a short profiling run of the engine itself
(`StepModel.calibrated`: batch-1 seconds per prompt token and per output token, as bench/trace_replay.py
measures them). Per replica, the batch is the largest that fits the KV cache and keeps the decode step
under the ITL SLO; the arrival rate is then the largest whose p90 TTFT (prefill + queueing, an M/G/1
estimate) stays under the TTFT SLO. Replicas = ceil(target rate ÷ that rate), and at least what memory
alone needs.

A step model predicts one engine alone on its GPU. Where the serving unit was measured on the workload
itself (`Measured`: its closed-loop saturated request rate, and its p90 TTFT at low load), the queueing uses
those instead: this holds where engines share a GPU, or where long prompts make prefill cost more than
linear, which a batch-1 calibration does not see (docs/capacity-gpu.md).
"""

import math
from dataclasses import asdict, dataclass, field

DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "fp16": 2.0, "float16": 2.0, "bf16": 2.0, "bfloat16": 2.0,
               "fp8": 1.0, "int8": 1.0, "int4": 0.5}  # fmt: skip
GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class ModelShape:
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: float = 2.0
    params: float = 0.0  # parameter count (for the weights' bytes and the prefill roofline)
    weight_dtype_bytes: float = 2.0

    @property
    def kv_bytes_per_token(self) -> int:
        return int(2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes)

    @property
    def weight_bytes(self) -> float:
        return self.params * self.weight_dtype_bytes

    @classmethod
    def from_hf_config(
        cls, config: dict, dtype: str | None = None, kv_dtype: str | None = None
    ) -> "ModelShape":
        """From a HF config.json: KV heads default to attention heads (MHA), head size to hidden ÷ heads;
        parameters counted from the shape (attention, gated MLP, embeddings, tied or not)."""
        text = config.get("text_config") or config
        hidden, layers = int(text["hidden_size"]), int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or hidden // heads)
        inter = int(text.get("intermediate_size") or 4 * hidden)
        vocab = int(text.get("vocab_size") or 0)
        attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
        mlp = 3 * hidden * inter
        embeddings = (
            vocab * hidden * (1 if config.get("tie_word_embeddings", text.get("tie_word_embeddings")) else 2)
        )
        params = layers * (attention + mlp + 2 * hidden) + embeddings
        weights = DTYPE_BYTES[dtype or str(text.get("torch_dtype") or config.get("torch_dtype") or "bf16")]
        kv = DTYPE_BYTES[kv_dtype] if kv_dtype else weights if weights >= 2 else 2.0
        return cls(layers, kv_heads, head_dim, kv, float(params), weights)


@dataclass(frozen=True)
class Gpu:
    memory_bytes: float
    bandwidth_bytes_s: float
    flops: float = 0.0  # dense fp16/bf16 FLOP/s, for the roofline prefill estimate


GPUS = {
    "H100": Gpu(80 * GB, 3.35e12, 989e12),
    "H200": Gpu(141 * GB, 4.8e12, 989e12),
    "A100-80GB": Gpu(80 * GB, 2.0e12, 312e12),
    "L40S": Gpu(48 * GB, 0.864e12, 362e12),
}


def sequences_fit(
    memory_bytes: float, weight_bytes: float, kv_bytes_per_token: float, tokens_per_sequence: int,
    utilization: float = 1.0, overhead_bytes: float = 0.0,
) -> int:  # fmt: skip
    """Whole sequences of `tokens_per_sequence` whose KV cache fits in what the weights leave."""
    left = memory_bytes * utilization - weight_bytes - overhead_bytes
    return max(0, math.floor(left / (kv_bytes_per_token * tokens_per_sequence)))


def gpus_for(weight_bytes: float, kv_bytes_per_sequence: float, sequences: int, gpu_memory: float) -> float:
    """The seed's formula: (weights + cache per sequence × concurrent sequences) ÷ memory per GPU."""
    return (weight_bytes + kv_bytes_per_sequence * sequences) / gpu_memory


@dataclass(frozen=True)
class StepModel:
    base_s: float  # a decode step's fixed cost (weights read once, launches)
    per_kv_byte_s: float  # each byte of running sequences' KV cache read in a decode step
    prefill_s_per_token: float
    source: str = "roofline"

    def decode_step_s(self, batch: int, context_tokens: float, kv_bytes_per_token: float) -> float:
        return self.base_s + self.per_kv_byte_s * kv_bytes_per_token * batch * context_tokens

    @classmethod
    def roofline(
        cls, shape: ModelShape, gpu: Gpu, gpus: int = 1, efficiency: float = 0.7, mfu: float = 0.4
    ) -> "StepModel":
        bandwidth = gpu.bandwidth_bytes_s * gpus * efficiency
        prefill = 2 * shape.params / (gpu.flops * gpus * mfu) if gpu.flops else 0.0
        return cls(shape.weight_bytes / bandwidth, 1 / bandwidth, prefill)

    @classmethod
    def calibrated(
        cls, s_per_output_token: float, s_per_prompt_token: float, kv_share: float = 0.0,
        per_kv_byte_s: float | None = None,
    ) -> "StepModel":  # fmt: skip
        """From batch-1 measurements of the engine: a decode step's time is almost all `base_s`;
        `per_kv_byte_s` from a second point, or the roofline's ratio (kv_share: a step's share spent on KV)."""
        base = s_per_output_token * (1 - kv_share)
        return cls(base, per_kv_byte_s or 0.0, s_per_prompt_token, "calibrated")


@dataclass(frozen=True)
class Measured:
    """One serving unit (a replica, or the engines sharing one GPU) measured on the workload: the request
    rate it sustains under closed-loop saturation, and its p90 TTFT at low load (bench/trace_replay.py's
    setup.capacity.requests and its lowest load's TTFT p90)."""

    requests_per_s: float
    ttft_p90_s: float | None = None


@dataclass(frozen=True)
class Workload:
    rate_per_s: float
    input_mean: float
    output_mean: float
    input_p90: float
    hit_rate: float = 0.0  # share of prompt tokens served from the prefix cache
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.1


@dataclass
class Plan:
    kv_bytes_per_token: int
    kv_bytes_per_sequence: float
    weight_bytes: float
    sequences_fit: int
    batch: int
    decode_step_s: float
    max_rate_per_replica: float
    replicas: int
    replicas_for_memory: int
    limited_by: str
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def ttft_p90_s(rate: float, work: dict[str, float]) -> float:
    """p90 TTFT at `rate`: the p90 prefill plus one decode step plus M/G/1 queueing (mean wait × ln 10, an
    exponential tail) behind the engine's busy time per request."""
    busy = work["busy_s"]
    load = rate * busy
    if load >= 1:
        return math.inf
    wait = load * work["busy2_s"] / (2 * busy * (1 - load))
    return work["prefill_p90_s"] + work["step_s"] + math.log(10) * wait


def plan(
    shape: ModelShape, gpu_memory_bytes: float, steps: StepModel, workload: Workload, gpus_per_replica: int = 1,
    utilization: float = 0.9, max_batch: int = 256, measured: Measured | None = None,
) -> Plan:  # fmt: skip
    per_token = shape.kv_bytes_per_token
    context = workload.input_mean + workload.output_mean
    memory = gpu_memory_bytes * gpus_per_replica
    fit = sequences_fit(memory, shape.weight_bytes, per_token, max(1, round(context)), utilization)
    notes = []
    batch, limited = min(fit, max_batch), "kv_cache" if fit < max_batch else "max_batch"
    mean_context = workload.input_mean + workload.output_mean / 2  # a running sequence is half-way through
    while batch > 1 and steps.decode_step_s(batch, mean_context, per_token) > workload.itl_slo_s:
        batch, limited = batch - 1, "itl_slo"
    if batch < 1:
        return Plan(per_token, per_token * context, shape.weight_bytes, fit, 0, 0.0, 0.0, 0, 0, "memory",
                    ["the weights leave no room for one sequence"])  # fmt: skip
    step = steps.decode_step_s(batch, mean_context, per_token)
    if step > workload.itl_slo_s:
        notes.append(f"a decode step at batch 1 ({step * 1000:.1f} ms) already misses the ITL SLO")
    uncached = 1 - workload.hit_rate
    prefill = workload.input_mean * uncached * steps.prefill_s_per_token
    decode = workload.output_mean * step / batch  # the request's share of the batched decode steps
    busy = prefill + decode
    work = {"busy_s": busy, "busy2_s": busy * busy * 1.5, "step_s": step,
            "prefill_p90_s": workload.input_p90 * uncached * steps.prefill_s_per_token}  # fmt: skip
    if measured is not None:  # the unit's measured service rate and unloaded TTFT replace the step model's
        busy = 1 / measured.requests_per_s
        work.update(busy_s=busy, busy2_s=busy * busy * 1.5)
        if measured.ttft_p90_s is not None:
            work.update(prefill_p90_s=measured.ttft_p90_s, step_s=0.0)
        notes.append("queueing from the measured service rate" + (" and TTFT" if measured.ttft_p90_s else ""))
    lo, hi = 0.0, 1 / busy
    if ttft_p90_s(0.0, work) > workload.ttft_slo_s:
        notes.append("the p90 prompt's prefill alone misses the TTFT SLO")
        hi = 0.0
    for _ in range(60):  # the largest rate whose p90 TTFT meets the SLO
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ttft_p90_s(mid, work) <= workload.ttft_slo_s else (lo, mid)
    rate = lo
    replicas = math.ceil(workload.rate_per_s / rate) if rate > 0 else 0
    for_memory = math.ceil(
        gpus_for(shape.weight_bytes, per_token * context, batch, memory * utilization)
    )  # fmt: skip
    if rate < 1 / busy * 0.999 and limited != "itl_slo":
        limited = "ttft_slo"
    if rate <= 0:
        notes.append("no arrival rate meets the SLO on this replica: replicas is 0 (none suffices)")
    return Plan(per_token, per_token * context, shape.weight_bytes, fit, batch, step, rate, replicas,
                for_memory, limited, notes)  # fmt: skip
