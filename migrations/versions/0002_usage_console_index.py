"""usage records: a covering index on ts for the console's window aggregates (issue 46)

On PostgreSQL the index carries every column the overview, series and usage queries read, so a window is
aggregated by an index-only scan (bench/console_load.py). SQLite keeps ix_usage_ts.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS = ["model", "tenant_id", "key_id", "status", "cache_status", "prompt_tokens", "completion_tokens",
           "cost_usd", "latency_ms"]  # fmt: skip


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_usage_ts_covering", "usage_records", ["ts"], postgresql_include=COLUMNS)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_usage_ts_covering", table_name="usage_records")
