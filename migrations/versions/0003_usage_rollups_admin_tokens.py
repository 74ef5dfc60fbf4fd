"""hourly, daily and weekly usage rollups (issue 46) and scoped admin tokens

usage_records.rolled marks the records already summed into the rollups (policies/rollups.py compacts the
others; the queries read a record either from its rollup or raw, never both). ix_usage_unrolled finds those
not yet rolled; ix_usage_model_latency serves the exact percentiles (a latency bucket's records).
Existing records start unrolled: the gateway's compaction rolls them up in batches after the upgrade.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _measures() -> list[sa.Column]:
    return [
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("latency_ms_sum", sa.Float(), nullable=False),
    ]


def upgrade() -> None:
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rolled", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.create_index(
            "ix_usage_unrolled",
            ["id"],
            sqlite_where=sa.text("NOT rolled"),
            postgresql_where=sa.text("NOT rolled"),
        )
        batch_op.create_index("ix_usage_model_latency", ["model", "latency_ms"], postgresql_include=["ts"])
    op.create_table(
        "usage_hourly",
        sa.Column("hour", sa.DateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("deployment", sa.String(length=200), nullable=False),
        sa.Column("cache_status", sa.String(length=32), nullable=False),
        *_measures(),
        sa.PrimaryKeyConstraint("hour", "tenant_id", "key_id", "model", "deployment", "cache_status"),
    )
    op.create_table(
        "usage_hourly_models",
        sa.Column("hour", sa.DateTime(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("deployment", sa.String(length=200), nullable=False),
        sa.Column("cache_status", sa.String(length=32), nullable=False),
        *_measures(),
        sa.PrimaryKeyConstraint("hour", "model", "deployment", "cache_status"),
    )
    op.create_table(
        "usage_daily_keys",
        sa.Column("day", sa.DateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        *_measures(),
        sa.PrimaryKeyConstraint("day", "tenant_id", "key_id"),
    )
    op.create_index("ix_usage_daily_keys_key", "usage_daily_keys", ["key_id", "day"])
    op.create_table(
        "usage_weekly_keys",
        sa.Column("week", sa.DateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        *_measures(),
        sa.PrimaryKeyConstraint("week", "tenant_id", "key_id"),
    )
    op.create_table(
        "usage_daily_tenants",
        sa.Column("day", sa.DateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        *_measures(),
        sa.PrimaryKeyConstraint("day", "tenant_id"),
    )
    op.create_table(
        "usage_hourly_latency",
        sa.Column("hour", sa.DateTime(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("hour", "model", "bucket"),
    )
    op.create_table(
        "admin_tokens",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )


def downgrade() -> None:
    op.drop_table("admin_tokens")
    op.drop_table("usage_hourly_latency")
    op.drop_table("usage_daily_tenants")
    op.drop_table("usage_weekly_keys")
    op.drop_index("ix_usage_daily_keys_key", table_name="usage_daily_keys")
    op.drop_table("usage_daily_keys")
    op.drop_table("usage_hourly_models")
    op.drop_table("usage_hourly")
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.drop_index("ix_usage_model_latency")
        batch_op.drop_index("ix_usage_unrolled")
        batch_op.drop_column("rolled")
