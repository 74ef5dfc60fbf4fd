"""Process-wide settings of this package, nested in the gateway settings (LLMGW_POLICIES__<FIELD>)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from core.renamed import AcceptsFormerNames, formerly

SslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]


class RedisOptions(BaseModel):
    """How the rate limiter (and the change notifier) reach Redis, besides the URL
    (LLMGW_POLICIES__REDIS__<FIELD>). TLS is `rediss://`; the URL carries user, password and db."""

    model_config = ConfigDict(extra="forbid")

    tls_ca_file: Path | None = None  # PEM bundle the server's certificate must chain to; None = system CAs
    tls_cert_file: Path | None = None  # client certificate (mutual TLS), PEM
    tls_key_file: Path | None = None  # its private key, PEM (default: inside tls_cert_file)
    tls_verify: bool = True  # check the server's certificate and host name; false only for testing
    tls_server_name: str | None = None  # the name the certificate must carry, when connecting by address
    cluster: bool = False  # the URL names one node (or several, comma-separated) of a Redis Cluster
    sentinel_master: str | None = None  # set: the URL's hosts are Sentinels, and this the monitored master
    sentinel_username: str | None = (
        None  # credentials of the Sentinels themselves (the URL's are the master's)
    )
    sentinel_password: SecretStr | None = None  # with sentinel_username


class DatabaseOptions(BaseModel):
    """The database connection pool and PostgreSQL TLS (LLMGW_POLICIES__DATABASE__<FIELD>); `sslmode` and
    `sslrootcert` in the URL's query work too, and these settings win over them."""

    model_config = ConfigDict(extra="forbid")

    pool_size: int = Field(default=5, ge=1)  # connections kept open per process
    max_overflow: int = Field(default=10, ge=0)  # extra connections under load, closed when returned
    pool_timeout_s: float = Field(default=30.0, gt=0)  # wait for a free connection, then fail
    pool_recycle_s: float = Field(default=1800.0, gt=0)  # reopen connections older than this
    sslmode: SslMode | None = None  # PostgreSQL's libpq meanings; None = the URL's, else "prefer"
    sslrootcert: Path | None = None  # CA bundle for verify-ca / verify-full
    sslcert: Path | None = None  # client certificate (mutual TLS)
    sslkey: Path | None = None  # its private key


class PoliciesSettings(AcceptsFormerNames):
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
    redis: RedisOptions = Field(default_factory=RedisOptions)
    database: DatabaseOptions = Field(default_factory=DatabaseOptions)
    replicas: int | None = Field(default=None, ge=1)  # fail-open share = limit / replicas; None = count them
    replica_heartbeat_s: float = Field(default=5.0, gt=0)  # how often replicas note themselves in Redis
    refresh_interval_s: float = 15.0  # backstop reload of keys/policies besides pub/sub invalidation
    window_s: int = 60  # the rolling window of RPM/TPM limits
    # in-flight slots and budget reservations: renewed every third of it; a dead replica's free after it
    concurrency_lease_s: float = Field(default=30.0, gt=0, le=30)
    reserve_completion_tokens: int = Field(
        default=1024,
        validation_alias=formerly("reserve_completion_tokens", "default_max_tokens"),
        description="completion tokens a request's TPM reservation counts when neither the request "
        "(max_completion_tokens / max_tokens) nor its policy sets any; settlement replaces it with the real "
        "usage",
    )
    usage_queue_size: int = Field(default=50_000, ge=1)  # records buffered while the database is away
    usage_batch_size: int = Field(default=500, ge=1)  # usage records written per transaction, at most
    usage_flush_interval_s: float = 1.0  # buffered usage records are written this often
    usage_retry_max_s: float = Field(default=5.0, gt=0)  # backoff cap between write attempts
    usage_shutdown_timeout_s: float = Field(default=10.0, ge=0)  # then what is still buffered is dropped
    usage_rollup_interval_s: float = Field(
        default=30.0, gt=0, description="how often each replica rolls usage records up (admin API on)"
    )
    usage_rollup_batch: int = Field(default=5000, ge=1, description="usage records rolled up per transaction")

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
