"""Process-wide settings of this package, nested in the gateway settings (LLMGW_POLICIES__<FIELD>)."""

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class PoliciesSettings(BaseModel):
    """Process-wide policies settings; per-tenant behaviour belongs in the policy instead."""

    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a silent default

    db_schema: str | None = None  # PostgreSQL schema (search_path); None = the server default
    auto_migrate: bool | None = None  # None = migrate at start for SQLite only (migrates_at_start)
    redis_prefix: str = "llmgw:"  # every Redis key and channel of this package starts with it
    # Redis unavailable: per-replica share of the limits ("open"), or 503 ("closed"); a policy may override
    redis_failure_mode: Literal["open", "closed"] = "open"
    redis_timeout_s: float = Field(
        default=0.05, gt=0
    )  # bound on every rate-limit Redis call, connecting included
    redis_retry_s: float = Field(
        default=0.5, gt=0
    )  # the breaker's open time before one probe tries Redis again
    replicas: int | None = Field(default=None, ge=1)  # fail-open share = limit / replicas; None = count them
    replica_heartbeat_s: float = Field(default=5.0, gt=0)  # how often replicas note themselves in Redis
    refresh_interval_s: float = 15.0  # backstop reload of keys/policies besides pub/sub invalidation
    window_s: int = 60  # the rolling window of RPM/TPM limits
    # in-flight slots and budget reservations: renewed every third of it; a dead replica's free after it
    concurrency_lease_s: float = Field(default=30.0, gt=0, le=30)
    default_max_tokens: int = 1024  # TPM reservation when neither request nor policy sets max_tokens
    usage_queue_size: int = Field(default=50_000, ge=1)  # records buffered while the database is away
    usage_batch_size: int = Field(default=500, ge=1)
    usage_flush_interval_s: float = 1.0
    usage_retry_max_s: float = Field(default=5.0, gt=0)  # backoff cap between write attempts
    usage_shutdown_timeout_s: float = Field(default=10.0, ge=0)  # then what is still buffered is dropped

    def migrates_at_start(self, database_url: str) -> bool:
        """Whether the gateway (and the `llmgw keys` command) upgrades the schema itself."""
        return bool(self.auto_migrate or (self.auto_migrate is None and database_url.startswith("sqlite")))


@dataclass(frozen=True)
class Connections:
    """What this package reaches outside the process, and the keys that open the proxy and the admin API."""

    database_url: str
    redis_url: str | None
    master_key: SecretStr
    admin_token: SecretStr | None = None
