"""Request and response bodies of the admin API (they also make its OpenAPI docs)."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.settings import ModelConfig
from policies.policy import Policy


class PolicyIn(Policy):
    name: str = Field(min_length=1, max_length=200)


class PolicyOut(PolicyIn):
    model_config = ConfigDict(extra="ignore")

    id: str
    created_at: datetime
    updated_at: datetime


class TenantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="generated if absent"
    )
    name: str = Field(min_length=1, max_length=200)
    policy_id: str | None = None


class TenantPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=200)
    policy_id: str | None = Field(default=None, description="null detaches the policy")


class TenantOut(BaseModel):
    id: str
    name: str
    policy_id: str | None
    created_at: datetime


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    name: str = Field(default="", max_length=200)
    policy_id: str | None = Field(default=None, description="overrides the tenant's policy for this key")
    expires_at: datetime | None = None


class KeyPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, max_length=200)
    policy_id: str | None = Field(default=None, description="null: the tenant's policy applies")
    expires_at: datetime | None = Field(default=None, description="null: never expires")


class KeyOut(BaseModel):
    id: str
    tenant_id: str
    name: str
    prefix: str
    policy_id: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class KeyCreated(KeyOut):
    key: str = Field(description="the secret; shown once, only its hash is stored")


class ModelOut(BaseModel):
    name: str
    source: Literal["static", "database"]
    config: ModelConfig


class UsageOut(BaseModel):
    start: datetime | None
    end: datetime | None
    group_by: list[str]
    data: list[dict[str, Any]]


class CacheFlushIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str | None = None
    model: str | None = None


class CacheFlushOut(BaseModel):
    flushed: int


class CacheFeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=200)


class CacheFeedbackOut(BaseModel):
    request_id: str
    evicted: bool  # false: no semantic hit with this id is remembered on this replica


class Deleted(BaseModel):
    id: str
    deleted: bool = True
