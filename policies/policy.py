"""A policy: what a tenant (or one key) may use, how fast, and how much it may spend."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Rolling-window limits; None means unlimited."""

    model_config = ConfigDict(extra="forbid")

    rpm: int | None = Field(default=None, ge=0, description="requests per rolling minute")
    tpm: int | None = Field(default=None, ge=0, description="prompt+completion tokens per rolling minute")
    max_concurrent: int | None = Field(default=None, ge=0, description="requests in flight at once")

    def is_empty(self) -> bool:
        return self.rpm is None and self.tpm is None and self.max_concurrent is None


class Budget(BaseModel):
    """Spend ceilings in USD per UTC day and per UTC calendar month; None means unlimited."""

    model_config = ConfigDict(extra="forbid")

    usd_per_day: float | None = Field(default=None, ge=0)
    usd_per_month: float | None = Field(default=None, ge=0)


class Policy(BaseModel):
    """Attached to a tenant (all its keys) or to a single key (overrides the tenant's policy).

    `cache`, `routing` and `cascade` are validated dicts until the cache/routing packages publish
    `CachePolicy` / `RoutingPolicy` / `CascadePolicy`; the lead swaps the types in.
    """

    model_config = ConfigDict(extra="forbid")

    allowed_models: list[str] | None = Field(default=None, description="model aliases; None = all")
    key_limits: Limits = Field(default_factory=Limits, description="applied to each key separately")
    tenant_limits: Limits = Field(default_factory=Limits, description="applied to the tenant's total")
    model_limits: dict[str, Limits] = Field(
        default_factory=dict, description="per model alias, applied to the tenant's total for that model"
    )
    key_budget: Budget = Field(default_factory=Budget)
    tenant_budget: Budget = Field(default_factory=Budget)
    default_max_tokens: int | None = Field(
        default=None, ge=1, description="TPM reservation when the request sets no max_tokens"
    )
    cache: dict[str, Any] = Field(default_factory=dict)
    routing: dict[str, Any] = Field(default_factory=dict)
    cascade: dict[str, Any] = Field(default_factory=dict)

    def allows(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models
