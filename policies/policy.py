"""A policy: what a tenant (or one key) may use, how fast, and how much it may spend."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cache.config import CachePolicy
from core.renamed import AcceptsFormerNames, formerly
from routing.config import CascadePolicy, RoutingPolicy

# The largest limit or budget: counters live in Redis as doubles (exact to 2**53); above this, say None.
MAX_LIMIT = 10**12


class Limits(BaseModel):
    """Rolling-window limits; None means unlimited."""

    model_config = ConfigDict(extra="forbid")

    rpm: int | None = Field(default=None, ge=0, le=MAX_LIMIT, description="requests per rolling minute")
    tpm: int | None = Field(
        default=None, ge=0, le=MAX_LIMIT, description="prompt+completion tokens per rolling minute"
    )
    max_concurrent: int | None = Field(
        default=None, ge=0, le=MAX_LIMIT, description="requests in flight at once"
    )

    def is_empty(self) -> bool:
        return self.rpm is None and self.tpm is None and self.max_concurrent is None


class Budget(BaseModel):
    """Spend ceilings in USD per UTC day and per UTC calendar month; None means unlimited."""

    model_config = ConfigDict(extra="forbid")

    usd_per_day: float | None = Field(default=None, ge=0, le=MAX_LIMIT)
    usd_per_month: float | None = Field(default=None, ge=0, le=MAX_LIMIT)


class Policy(AcceptsFormerNames):
    """Attached to a tenant (all its keys) or to a single key (overrides the tenant's policy).

    `cache`, `routing` and `cascade` hold the fields of the cache and routing packages' own section
    models (CachePolicy, RoutingPolicy, CascadePolicy), validated here and kept as given, so the
    cache can merge them over its process-wide defaults; empty means those defaults.
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
    reserve_completion_tokens: int | None = Field(
        default=None,
        ge=1,
        validation_alias=formerly("reserve_completion_tokens", "default_max_tokens"),
        description="completion tokens the TPM reservation counts when the request sets no max_tokens; None ="
        " the gateway's policies.reserve_completion_tokens",
    )
    redis_failure_mode: Literal["open", "closed"] | None = Field(
        default=None,
        description="while Redis is unavailable: 'open' = each replica's share of the limits, 'closed' = 503;"
        " None = the gateway's setting",
    )
    cache: dict[str, Any] = Field(default_factory=dict, description="cache.config.CachePolicy fields")
    routing: dict[str, Any] = Field(default_factory=dict, description="routing.config.RoutingPolicy fields")
    cascade: dict[str, Any] = Field(default_factory=dict, description="routing.config.CascadePolicy fields")

    @field_validator("cache", "routing", "cascade")
    @classmethod
    def _valid_section(cls, value: dict[str, Any], info: Any) -> dict[str, Any]:
        if value:
            _SECTIONS[info.field_name].model_validate(value)
        return value

    def allows(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


_SECTIONS: dict[str, type[BaseModel]] = {
    "cache": CachePolicy,
    "routing": RoutingPolicy,
    "cascade": CascadePolicy,
}
