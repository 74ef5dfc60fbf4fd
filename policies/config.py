"""Process-wide settings of this package, nested in the gateway settings (LLMGW_POLICIES__<FIELD>)."""

from typing import Literal

from pydantic import BaseModel, Field


class PoliciesSettings(BaseModel):
    """Process-wide policies settings; per-tenant behaviour belongs in the policy instead."""

    db_schema: str | None = None  # PostgreSQL schema (search_path); None = the server default
    auto_migrate: bool | None = None  # None = migrate at start for SQLite only
    redis_prefix: str = "llmgw:"  # every Redis key and channel of this package starts with it
    redis_failure_mode: Literal["open", "closed"] = "open"  # Redis down: per-replica limits, or 503
    redis_timeout_s: float = 5.0  # socket timeout of the rate-limit client; a starved event loop counts too
    redis_max_connections: int = 64  # requests beyond it wait for a free connection (pool timeout)
    redis_pool_timeout_s: float = 10.0
    redis_retry_s: float = 1.0  # after a Redis failure, use the fallback this long before retrying
    refresh_interval_s: float = 15.0  # backstop reload of keys/policies besides pub/sub invalidation
    window_s: int = 60  # the rolling window of RPM/TPM limits
    concurrency_lease_s: int = 900  # a crashed replica's in-flight slots expire after this long
    default_max_tokens: int = 1024  # TPM reservation when neither request nor policy sets max_tokens
    usage_queue_size: int = Field(default=50_000, ge=1)  # records buffered while the database is away
    usage_batch_size: int = Field(default=500, ge=1)
    usage_flush_interval_s: float = 1.0
    usage_retry_max_s: float = Field(default=5.0, gt=0)  # backoff cap between write attempts
    usage_shutdown_timeout_s: float = Field(default=10.0, ge=0)  # then what is still buffered is dropped
