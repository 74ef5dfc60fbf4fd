"""One planning request, as `llmgw plan` and `POST /admin/v1/plan` both take it, and the answer it gets.

The CLI fills it from its flags (and may replace the workload by one read from a trace file, or the step
model by a calibration file); the admin route takes it as its JSON body. Either way `answer()` runs the
same arithmetic (capacity.py) and returns the same JSON.
"""

from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from routing.planning.capacity import (
    DTYPE_BYTES,
    GB,
    GPUS,
    Gpu,
    Measured,
    ModelShape,
    StepModel,
    Workload,
    plan,
    sequences_fit,
)

DType = Literal["fp32", "float32", "fp16", "float16", "bf16", "bfloat16", "fp8", "int8", "int4"]
GpuName = Literal["H100", "H200", "A100-80GB", "L40S"]


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layers: int = Field(ge=1, le=1000)
    kv_heads: int = Field(ge=1, le=1024)
    head_dim: int = Field(ge=1, le=4096)


class PlanRequest(BaseModel):
    """A model (a HF config.json's content, or a shape), a GPU, a workload and an SLO."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] | None = Field(default=None, description="a HF config.json's content")
    shape: Shape | None = Field(default=None, description="instead of config")
    params: float = Field(default=0.0, ge=0, description="parameter count (with shape)")
    weights_gb: float | None = Field(default=None, gt=0, description="the weights' measured size")
    dtype: DType | None = Field(default=None, description="weights (default: config's, else fp16)")
    kv_dtype: DType | None = Field(default=None, description="KV cache (default: as the weights)")
    gpu: GpuName = "H100"
    gpu_memory_gb: float | None = Field(default=None, gt=0)
    gpu_bandwidth_tbs: float | None = Field(default=None, gt=0)
    gpus_per_replica: int = Field(default=1, ge=1, le=64)
    utilization: float = Field(default=0.9, gt=0, le=1)
    rate: float = Field(default=1.0, gt=0, description="arrivals per second")
    input_mean: float = Field(default=1000, gt=0)
    input_p90: float | None = Field(default=None, gt=0)
    output_mean: float = Field(default=200, gt=0)
    hit_rate: float = Field(default=0.0, ge=0, lt=1, description="prefix-cache hit rate of prompt tokens")
    ttft_slo_ms: float = Field(default=2000, gt=0)
    itl_slo_ms: float = Field(default=100, gt=0)
    sequence_tokens: int | None = Field(default=None, ge=1, description="also: sequences of this length")
    s_per_output_token: float | None = Field(default=None, gt=0, description="measured batch-1 decode step")
    s_per_prompt_token: float | None = Field(default=None, gt=0, description="measured prefill per token")
    max_batch: int = Field(default=256, ge=1, le=100_000)
    capacity_rps: float | None = Field(
        default=None, gt=0, description="a serving unit's measured closed-loop request rate on this workload"
    )
    unloaded_ttft_p90_ms: float | None = Field(
        default=None, gt=0, description="its measured p90 TTFT at low load (with capacity_rps)"
    )

    @model_validator(mode="after")
    def _one_model(self) -> "PlanRequest":
        if (self.config is None) == (self.shape is None):
            raise ValueError("give either config (a HF config.json) or shape")
        return self

    def model_shape(self) -> ModelShape:
        if self.config is not None:
            try:
                shape = ModelShape.from_hf_config(self.config, self.dtype, self.kv_dtype)
            except (KeyError, TypeError, ValueError) as error:
                raise ValueError(f"config is not a usable HF config.json: {error}") from None
        else:
            assert self.shape is not None
            weights = DTYPE_BYTES[self.dtype or "fp16"]
            kv = DTYPE_BYTES[self.kv_dtype] if self.kv_dtype else max(weights, 2.0)
            s = self.shape
            shape = ModelShape(s.layers, s.kv_heads, s.head_dim, kv, self.params, weights)
        if self.weights_gb:
            shape = replace(shape, params=self.weights_gb * GB / shape.weight_dtype_bytes)
        return shape

    def gpu_spec(self) -> Gpu:
        base = GPUS[self.gpu]
        memory = self.gpu_memory_gb * GB if self.gpu_memory_gb else base.memory_bytes
        bandwidth = self.gpu_bandwidth_tbs * 1e12 if self.gpu_bandwidth_tbs else base.bandwidth_bytes_s
        return Gpu(memory, bandwidth, base.flops)

    def workload(self) -> Workload:
        return Workload(self.rate, self.input_mean, self.output_mean, self.input_p90 or self.input_mean,
                        self.hit_rate, self.ttft_slo_ms / 1000, self.itl_slo_ms / 1000)  # fmt: skip


def answer(request: PlanRequest, workload: Workload | None = None, steps: StepModel | None = None) -> dict:
    """The plan as JSON: model, GPU, workload, step model, the plan, and sequences of a length if asked."""
    shape, gpu = request.model_shape(), request.gpu_spec()
    workload = workload or request.workload()
    roofline = StepModel.roofline(shape, gpu, request.gpus_per_replica)
    if steps is None and request.s_per_output_token:
        # batch 1 measures the weights' read; a batch's KV reads cost what the roofline charges them
        prefill = request.s_per_prompt_token or roofline.prefill_s_per_token
        steps = StepModel.calibrated(
            request.s_per_output_token, prefill, per_kv_byte_s=roofline.per_kv_byte_s
        )
    steps = steps or roofline
    measured = None
    if request.capacity_rps:
        ttft = request.unloaded_ttft_p90_ms / 1000 if request.unloaded_ttft_p90_ms else None
        measured = Measured(request.capacity_rps, ttft)
    result = plan(shape, gpu.memory_bytes, steps, workload, request.gpus_per_replica, request.utilization,
                  request.max_batch, measured)  # fmt: skip
    out = {"model": shape.__dict__, "gpu": gpu.__dict__, "workload": workload.__dict__, "step_model": steps.__dict__,
           "plan": result.as_dict()}  # fmt: skip
    if request.sequence_tokens:
        memory, tokens = gpu.memory_bytes * request.gpus_per_replica, request.sequence_tokens
        per_token = shape.kv_bytes_per_token
        out["sequences_of"] = {
            "tokens": tokens,
            "fit_all_memory": sequences_fit(memory, shape.weight_bytes, per_token, tokens),
            "fit_at_utilization": sequences_fit(memory, shape.weight_bytes, per_token, tokens, request.utilization),
        }  # fmt: skip
    return out
