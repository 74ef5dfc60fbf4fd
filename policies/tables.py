"""SQLAlchemy 2 tables: tenants, API keys, admin tokens, policies, DB-managed model aliases, usage records and
their hourly rollups (policies/rollups.py).

Times are naive UTC datetimes (the same on SQLite and PostgreSQL).
"""

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class PolicyRow(Base):
    __tablename__ = "policies"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # a policies.policy.Policy
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)


class TenantRow(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    policy_id: Mapped[str | None] = mapped_column(ForeignKey("policies.id", ondelete="RESTRICT"))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    prefix: Mapped[str] = mapped_column(String(32))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    policy_id: Mapped[str | None] = mapped_column(ForeignKey("policies.id", ondelete="RESTRICT"))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime)


class AdminTokenRow(Base):
    """An admin API token made through the API: `read` may only look, `admin` may change everything."""

    __tablename__ = "admin_tokens"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    scope: Mapped[str] = mapped_column(String(16))  # "read" or "admin"
    prefix: Mapped[str] = mapped_column(String(32))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime)


class ModelAliasRow(Base):
    __tablename__ = "model_aliases"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # a gateway.settings.ModelConfig
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)


class UsageRow(Base):
    __tablename__ = "usage_records"
    __table_args__ = (
        Index("ix_usage_tenant_ts", "tenant_id", "ts"),
        Index("ix_usage_key_ts", "key_id", "ts"),
        Index("ix_usage_ts", "ts"),
        Index(
            "ix_usage_unrolled", "id", sqlite_where=text("NOT rolled"), postgresql_where=text("NOT rolled")
        ),
        Index("ix_usage_model_latency", "model", "latency_ms", postgresql_include=["ts"]),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    ts: Mapped[datetime] = mapped_column(DateTime)
    request_id: Mapped[str] = mapped_column(String(64))
    tenant_id: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(200))
    deployment: Mapped[str | None] = mapped_column(String(200))
    endpoint: Mapped[str] = mapped_column(String(32))
    status: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    cache_status: Mapped[str] = mapped_column(String(32), default="bypass")
    rolled: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())  # in the rollups yet


def _measures() -> list[Any]:
    """What a rollup row sums over the usage records of its hour (or day) and dimensions."""
    return [
        mapped_column("requests", BigInteger, default=0),
        mapped_column("errors", BigInteger, default=0),
        mapped_column("prompt_tokens", BigInteger, default=0),
        mapped_column("completion_tokens", BigInteger, default=0),
        mapped_column("cached_tokens", BigInteger, default=0),
        mapped_column("cost_usd", Float, default=0.0),
        mapped_column("latency_ms_sum", Float, default=0.0),
    ]


class UsageHourlyRow(Base):
    """Usage per hour, tenant, key, model, deployment ('' for none) and cache status (the usage queries; a few
    keys' hours: ix_usage_hourly_key)."""

    __tablename__ = "usage_hourly"
    __table_args__ = (Index("ix_usage_hourly_key", "key_id", "hour"),)

    hour: Mapped[datetime] = mapped_column(DateTime, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    cache_status: Mapped[str] = mapped_column(String(32), primary_key=True)
    requests, errors, prompt_tokens, completion_tokens, cached_tokens, cost_usd, latency_ms_sum = _measures()


class UsageHourlyModelRow(Base):
    """Usage per hour, model, deployment and cache status: the overview's figures, a few rows an hour."""

    __tablename__ = "usage_hourly_models"

    hour: Mapped[datetime] = mapped_column(DateTime, primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)
    cache_status: Mapped[str] = mapped_column(String(32), primary_key=True)
    requests, errors, prompt_tokens, completion_tokens, cached_tokens, cost_usd, latency_ms_sum = _measures()


class UsageWeeklyKeyRow(Base):
    """Usage per week (from Monday 00:00 UTC), tenant and key: a key's month in a few rows."""

    __tablename__ = "usage_weekly_keys"

    week: Mapped[datetime] = mapped_column(DateTime, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    requests, errors, prompt_tokens, completion_tokens, cached_tokens, cost_usd, latency_ms_sum = _measures()


class UsageDailyKeyRow(Base):
    """Usage per day (UTC), tenant and key (a few keys' days: ix_usage_daily_keys_key)."""

    __tablename__ = "usage_daily_keys"
    __table_args__ = (Index("ix_usage_daily_keys_key", "key_id", "day"),)

    day: Mapped[datetime] = mapped_column(DateTime, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    requests, errors, prompt_tokens, completion_tokens, cached_tokens, cost_usd, latency_ms_sum = _measures()


class UsageDailyTenantRow(Base):
    """Usage per day (UTC) and tenant."""

    __tablename__ = "usage_daily_tenants"

    day: Mapped[datetime] = mapped_column(DateTime, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    requests, errors, prompt_tokens, completion_tokens, cached_tokens, cost_usd, latency_ms_sum = _measures()


class UsageHourlyLatencyRow(Base):
    """Requests per hour, model and latency bucket (policies/rollups.py, LATENCY_BOUNDS): the percentiles."""

    __tablename__ = "usage_hourly_latency"

    hour: Mapped[datetime] = mapped_column(DateTime, primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
