"""Settings of admission by pool capacity (LLMGW_ROUTING__ADMISSION__<FIELD>) and the tenant's service class.

A tenant (or one key) picks its class and weight in its policy's `routing` section (RoutingPolicy
`service_class`, `weight`); the classes themselves (their order, SLOs, queue deadlines, how much of a pool
they may fill) are process-wide, here.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ClassName = Literal["interactive", "standard", "batch"]
CLASS_NAMES: tuple[ClassName, ...] = ("interactive", "standard", "batch")


class ServiceClass(BaseModel):
    """One priority band. Lower `rank` is served first; it is also the `priority` sent to engines that
    take one (vLLM's `--scheduling-policy priority`: lower runs first)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(ge=0, le=100, description="order of service (lower first); sent as vLLM's priority")
    ttft_s: float = Field(gt=0, description="time-to-first-token target (goodput, the SLO metric)")
    itl_s: float = Field(gt=0, description="mean inter-token latency target")
    queue_deadline_s: float = Field(
        gt=0, description="longest wait in the gateway's queue; a request that cannot start by then is "
        "refused at once (429 with Retry-After) instead of waiting"
    )  # fmt: skip
    pool_share: float = Field(
        gt=0, le=1, description="share of a saturated pool's slots this class may fill: below 1, the rest "
        "stays free for the classes above it, so they start without waiting for a slot"
    )  # fmt: skip
    max_queued: int = Field(default=2000, ge=0, description="requests held per pool; beyond it, refused")


class SloGuardSettings(BaseModel):
    """Latency feedback (guard.py): the classes below one that misses its TTFT target get fewer slots."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True, description="cut the lower classes' share of a saturated pool while a higher class "
        "misses its TTFT target; give it back as the target is met"
    )  # fmt: skip
    window_s: float = Field(default=20.0, gt=0, description="TTFT outcomes are counted over this")
    interval_s: float = Field(default=1.0, gt=0, description="shares move at most this often")
    max_miss: float = Field(
        default=0.05, ge=0, lt=1, description="share of the higher classes' requests that may miss their "
        "TTFT target before the lower classes' share is cut"
    )  # fmt: skip
    min_samples: int = Field(default=10, ge=1, description="outcomes needed in the window to cut a share")
    decrease: float = Field(default=0.7, gt=0, lt=1, description="a cut multiplies the share by this")
    increase: float = Field(default=0.05, gt=0, le=1, description="added back per interval while met")
    min_factor: float = Field(default=0.1, gt=0, le=1, description="a share is never cut below this part")


def _default_classes() -> dict[ClassName, ServiceClass]:
    return {
        "interactive": ServiceClass(rank=0, ttft_s=1.0, itl_s=0.1, queue_deadline_s=2.0, pool_share=1.0),
        "standard": ServiceClass(rank=1, ttft_s=2.5, itl_s=0.2, queue_deadline_s=15.0, pool_share=0.95),
        "batch": ServiceClass(rank=2, ttft_s=30.0, itl_s=1.0, queue_deadline_s=300.0, pool_share=0.9),
    }


class AdmissionSettings(BaseModel):
    """Admission by pool capacity: when an alias's deployments are full, requests wait in the gateway in
    a bounded queue per class (weighted fair between tenants) instead of in the engines' queues."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="hold a saturated pool's excess in per-class queues")
    fair: bool = Field(
        default=True, description="weighted fair sharing between tenants of a class; false: first come, "
        "first served within a class (to measure what fairness buys)"
    )  # fmt: skip
    default_class: ClassName = Field(default="standard", description="for tenants whose policy names none")
    classes: dict[ClassName, ServiceClass] = Field(
        default_factory=_default_classes,
        description="interactive, standard, batch: their order, SLOs, deadlines",
    )
    kv_high: float = Field(
        default=0.98, gt=0, le=1, description="an engine this full of KV cache (scraped) takes no new request"
    )  # fmt: skip
    engine_queue: int = Field(
        default=0, ge=0, le=64, description="requests each engine whose slots are learned (no "
        "max_concurrency) may hold in its own queue beyond them, so that its learned slots can grow where long "
        "prefills keep requests waiting (one large engine per GPU; 2 there); 0: none"
    )  # fmt: skip
    share_window_s: float = Field(default=30.0, gt=0, description="served tokens are compared over this")
    answer_tokens_estimate: int = Field(
        default=256, ge=1, description="answer tokens assumed for a request that sets no max_tokens"
    )  # fmt: skip
    tick_s: float = Field(default=0.1, gt=0, description="queue re-checked this often (capacity changes)")
    fleet: bool = Field(default=True, description="share pools across gateway replicas through Redis")
    sync_interval_s: float = Field(
        default=0.25, gt=0, description="replicas exchange their counts this often"
    )
    replica_ttl_s: float = Field(default=2.0, gt=0, description="a replica silent this long holds no share")
    slo_guard: SloGuardSettings = Field(
        default_factory=SloGuardSettings, description="lower classes' share cut while a higher one misses TTFT"
    )  # fmt: skip

    @model_validator(mode="after")
    def _all_classes(self) -> "AdmissionSettings":
        missing = [name for name in CLASS_NAMES if name not in self.classes]
        if missing:
            self.classes = {**_default_classes(), **self.classes}
        ranked = sorted(self.classes.values(), key=lambda c: c.rank)
        if any(a.pool_share < b.pool_share for a, b in zip(ranked, ranked[1:], strict=False)):
            raise ValueError("a class may not fill more of a pool than the classes ranked above it")
        return self

    def ranked(self) -> list[ClassName]:
        return sorted(self.classes, key=lambda name: self.classes[name].rank)
