"""Process-wide settings of this package, nested in the gateway settings (LLMGW_ROUTING__<FIELD>).

Per-tenant behaviour lives in the policy: `RoutingPolicy` (Policy.routing) and `CascadePolicy`
(Policy.cascade). The same `CascadePolicy` shape declares static cascades in `RoutingSettings.cascades`.
"""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from routing.admission.config import AdmissionSettings, ClassName

StrategyName = Literal[
    "weighted_random", "round_robin", "least_outstanding", "peak_ewma", "prefix_affinity", "engine_score"
]
ConfidenceMethod = Literal["mean_logprob", "min_window", "learned", "router"]
MODELS_DIR = Path(__file__).resolve().parent / "models"


class ConfidenceConfig(BaseModel):
    """How the small answer is judged. Scores at or above `threshold` keep it (or, with `escalate_share`,
    scores at or above that quantile of the recent scores: a share of escalations fixed in advance).

    mean_logprob: mean token logprob of the small answer (threshold is a logprob, e.g. -0.4).
    min_window:   the lowest mean logprob over any `window` consecutive tokens (e.g. -1.5).
    learned:      P(small answer is good) from the model in `model_path` (threshold 0..1); by default the
                  shipped routing/models/cascade_confidence.npz (answer logprobs + top-2 margins, no
                  embedding; training/train_cascade_confidence.py).
    router:       a model on the question alone, decided BEFORE calling the small model; the shipped
                  routing/models/router_lr.npz (chosen by cross-task validation, bench/README.md: the
                  maximin choice over MMLU groups and MT-Bench, which is the length heuristic, P(weak model
                  correct) falling with the question's log length; it held on GSM8K too, where the earlier
                  markers model fell below random) takes threshold 0..1; a TextRouter/GainModel file from
                  training/train_router.py also fits.
    """

    model_config = ConfigDict(extra="forbid")

    method: ConfidenceMethod = Field(
        default="mean_logprob", description="how the small answer is judged (above)"
    )
    threshold: float = Field(default=-0.4, description="scores at or above it keep the small answer")
    window: int = Field(default=4, ge=1, description="tokens per window for min_window")
    model_path: str | None = Field(default=None, description="a .npz from training/train_router.py")
    escalate_share: float | None = Field(
        default=None, gt=0, lt=1,
        description="escalate this share of requests: the threshold becomes this quantile of the last "
        "`share_window` scores (routing/escalation.py); `threshold` decides until `share_warmup` are seen",
    )  # fmt: skip
    share_window: int = Field(default=500, ge=2, le=100_000, description="scores the share is taken over")
    share_warmup: int = Field(default=50, ge=1, description="scores seen before the share decides")

    @model_validator(mode="after")
    def _warmup_fits(self) -> "ConfidenceConfig":
        if self.share_warmup > self.share_window:
            raise ValueError("share_warmup must not exceed share_window")
        return self


class CascadePolicy(BaseModel):
    """A public alias served by a small model, escalated to a large one when the small answer looks weak."""

    model_config = ConfigDict(extra="forbid")

    alias: str = Field(default="auto", description="the model name clients ask for")
    small: str = Field(description="alias of the small model")
    large: str = Field(description="alias of the large model")
    confidence: ConfidenceConfig = Field(default_factory=ConfidenceConfig)
    max_small_tokens: int | None = Field(default=256, ge=1, description="cap on the small answer's length")
    stream_mode: Literal["buffer", "prefix"] = Field(
        default="buffer",
        description="buffer: decide on the whole small answer, then stream it; prefix: decide after "
        "`prefix_tokens` tokens (their logprobs and margins, as a whole answer's) and stream the rest live",
    )
    prefix_tokens: int = Field(
        default=16, ge=1, description="stream_mode prefix: tokens judged before streaming"
    )


class RoutingPolicy(BaseModel):
    """Per-tenant routing choices; None/empty means the RoutingSettings defaults."""

    model_config = ConfigDict(extra="forbid")

    strategy: StrategyName | None = Field(default=None, description="for every alias of this tenant")
    strategies: dict[str, StrategyName] = Field(default_factory=dict, description="per model alias")
    fallbacks: dict[str, list[str]] = Field(
        default_factory=dict, description="alias → aliases tried after the config's fallbacks"
    )
    max_attempts: int | None = Field(default=None, ge=1, description="tries per alias before falling back")
    service_class: ClassName | None = Field(
        default=None, description="interactive | standard | batch: the order a saturated pool serves in "
        "(routing.admission.classes: SLOs, queue deadlines); None = routing.admission.default_class"
    )  # fmt: skip
    weight: float | None = Field(
        default=None, gt=0, le=1000, description="share of a saturated pool against other tenants of the "
        "same class (2 gets twice the tokens of 1); None = 1"
    )  # fmt: skip


class ScoreWeights(BaseModel):
    """Weights of the engine_score strategy: prefix match minus queue depth minus KV-cache usage minus the
    prefill work waiting for it (as NVIDIA Dynamo's KV router counts blocks to prefill)."""

    prefix: float = Field(default=1.0, description="times the share of the prompt's blocks the replica holds")
    queue: float = Field(default=0.5, description="times its queue depth relative to the pool's mean")
    kv_usage: float = Field(default=0.3, description="times its KV-cache usage (0..1, scraped)")
    prefill: float = Field(
        default=1.0,
        description="times the prompt blocks it would prefill: those of requests sent to it still without a first "
        "byte plus this prompt's blocks it does not hold, relative to the pool's mean plus this prompt's",
    )


class RoutingSettings(BaseModel):
    """Process-wide routing settings; per-tenant behaviour belongs in the policy instead."""

    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a silent default

    default_strategy: StrategyName = Field(default="peak_ewma", description="for aliases of upstream servers")
    engine_strategy: StrategyName = Field(default="engine_score", description="default for engine pools")
    strategies: dict[str, StrategyName] = Field(default_factory=dict, description="per model alias")
    engine_pools: list[str] = Field(
        default_factory=list,
        description="aliases whose deployments are engine replicas (besides local_engine)",
    )
    prefix_block_chars: int = Field(default=128, ge=8, description="prompt characters per hashed block")
    prefix_entries_per_replica: int = Field(default=50_000, ge=1, description="block hashes remembered")
    prefix_chars_per_token: float = Field(
        default=4.0, gt=0, description="prompt characters per token: a replica whose engine exports its KV "
        "cache's size remembers only the blocks that cache holds"
    )  # fmt: skip
    load_epsilon: float = Field(default=0.25, ge=0, description="bounded load: (1+ε)×mean outstanding")
    load_slack: float = Field(default=2.0, ge=0, description="…or mean + this many requests, if larger")
    score_weights: ScoreWeights = Field(default_factory=ScoreWeights)
    ewma_decay_s: float = Field(default=10.0, gt=0, description="peak-EWMA time constant")
    scrape_metrics: bool = Field(default=True, description="read engine pools' /metrics in the background")
    scrape_interval_s: float = Field(
        default=1.0, gt=0, description="how often engine pools' /metrics are read"
    )
    metrics_stale_s: float = Field(default=5.0, gt=0, description="older scraped numbers are ignored")
    health_checks: bool = Field(default=True, description="probe every deployment; a failed probe ejects it")
    health_interval_s: float = Field(default=10.0, gt=0, description="how often deployments are probed")
    failures_to_open: int = Field(default=3, ge=1, description="consecutive failures that open the breaker")
    open_cooldown_s: float = Field(default=30.0, gt=0, description="ejection time before half-open probes")
    half_open_probes: int = Field(default=1, ge=1, description="requests let through while half-open")
    max_attempts: int = Field(default=3, ge=1, description="tries per alias (other replicas first)")
    backoff_base_s: float = Field(
        default=0.05, ge=0, description="retry wait: uniform in [0, min(backoff_max_s, this × 2^(attempt-1))]"
    )
    backoff_max_s: float = Field(default=1.0, ge=0, description="the longest retry wait")
    retry_budget_ratio: float = Field(
        default=0.2, ge=0, description="retries per first attempt, per deployment"
    )
    retry_budget_min_per_s: float = Field(default=5.0, ge=0, description="retries a second always allowed")
    retry_budget_burst: float = Field(default=10.0, ge=1, description="most retry tokens a deployment keeps")
    retry_after_max_s: float = Field(
        default=300.0, gt=0, description="longest upstream Retry-After honoured (a deployment's cool-down)"
    )
    first_byte_timeout_s: float | None = Field(default=None, gt=0, description="streams; None = read timeout")
    first_byte_timeouts: dict[str, float] = Field(default_factory=dict, description="per deployment name")
    cascades: list[CascadePolicy] = Field(default_factory=list, description="static cascades (YAML)")
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings, description="routing/admission")
    defaults: RoutingPolicy = Field(default_factory=RoutingPolicy, description="used when no policy applies")
