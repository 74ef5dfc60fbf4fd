"""Request and response bodies of the admin API (they also make its OpenAPI docs)."""

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema, field_validator
from pydantic.json_schema import SkipJsonSchema

from core.models import ModelConfig
from policies.admin.inputs import Expiry
from policies.policy import Policy


def _utc_iso(value: datetime) -> str:
    """The database keeps naive UTC; the API says so (RFC 3339 needs the offset)."""
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat().replace("+00:00", "Z")


Timestamp = Annotated[
    datetime,
    PlainSerializer(_utc_iso, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
_AT_LEAST_ONE = ConfigDict(
    extra="forbid", json_schema_extra={"minProperties": 1}
)  # a PATCH that sets nothing: 422


class PolicyIn(Policy):
    name: str = Field(min_length=1, max_length=200)


class PolicyOut(PolicyIn):
    model_config = ConfigDict(extra="ignore")

    id: str
    created_at: Timestamp
    updated_at: Timestamp


class TenantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="generated if absent; not 'master'"
    )
    name: str = Field(min_length=1, max_length=200)
    policy_id: str | None = None

    @field_validator("id")
    @classmethod
    def _not_master(cls, value: str | None) -> str | None:
        if value == "master":  # the master key's usage is recorded under it
            raise ValueError("'master' is reserved for the master key")
        return value


class TenantPatch(BaseModel):
    model_config = _AT_LEAST_ONE

    name: Annotated[str, Field(min_length=1, max_length=200)] | SkipJsonSchema[None] = None
    policy_id: str | None = Field(default=None, description="null detaches the policy")


class TenantOut(BaseModel):
    id: str
    name: str
    policy_id: str | None
    created_at: Timestamp


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    name: str = Field(default="", max_length=200)
    policy_id: str | None = Field(default=None, description="overrides the tenant's policy for this key")
    expires_at: Expiry | None = Field(default=None, description="between 1970 and 2100")


class KeyPatch(BaseModel):
    model_config = _AT_LEAST_ONE

    name: Annotated[str, Field(max_length=200)] | SkipJsonSchema[None] = None
    policy_id: str | None = Field(default=None, description="null: the tenant's policy applies")
    expires_at: Expiry | None = Field(default=None, description="null: never expires; at most 2100")


class KeyOut(BaseModel):
    id: str
    tenant_id: str
    name: str
    prefix: str
    policy_id: str | None
    created_at: Timestamp
    expires_at: Timestamp | None
    revoked_at: Timestamp | None


class KeyCreated(KeyOut):
    key: str = Field(description="the secret; shown once, only its hash is stored")


class ModelOut(BaseModel):
    name: str
    source: Literal["static", "database"]
    config: ModelConfig


class UsageOut(BaseModel):
    start: Timestamp | None
    end: Timestamp | None
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
