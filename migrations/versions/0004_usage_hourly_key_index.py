"""usage_hourly: an index on (key_id, hour) for a few keys' hours (issue 46)

The usage page's series reads its first keys' buckets: whole days from usage_daily_keys (ix_usage_daily_keys_key)
and the hours at the window's edges from usage_hourly, whose primary key starts with the hour, so each edge read
every key's rows of those hours (~20 ms of the page with 10,000 keys). Only an index, so replicas still on 0003
compact into the same tables unchanged.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_usage_hourly_key", "usage_hourly", ["key_id", "hour"])


def downgrade() -> None:
    op.drop_index("ix_usage_hourly_key", table_name="usage_hourly")
