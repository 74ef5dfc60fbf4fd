"""Schema migrations (Alembic, configured in code so `llmgw migrate` works from any directory).

Safe to run concurrently (a migration Job and replicas starting together, two Jobs after a double
deploy): on PostgreSQL each upgrade first takes a transaction-scoped advisory lock for its schema, so one
runs and the others wait, then find the schema at head and do nothing. SQLite serialises writers itself.
"""

import argparse
import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from policies.config import DatabaseOptions
from policies.db import create_engine

LOCK_NAME = "llmgw:migrate"  # one lock per database: schemas of one database migrate one at a time
SCRIPT_LOCATION = Path(__file__).resolve().parents[1] / "migrations"  # installed next to policies/


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    return config


async def upgrade_engine(engine: AsyncEngine, revision: str = "head", attempts: int = 3) -> None:
    """Upgrade under the migration lock (PostgreSQL); a failed attempt (a dropped connection) is retried."""
    for attempt in range(attempts):
        try:
            async with engine.begin() as conn:
                if conn.dialect.name == "postgresql":  # released when this transaction ends
                    await conn.execute(
                        text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": LOCK_NAME}
                    )
                await conn.run_sync(_upgrade, revision)
            return
        except DBAPIError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5 * (attempt + 1))


def _upgrade(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


async def upgrade_async(
    database_url: str, schema: str | None = None, options: DatabaseOptions | None = None
) -> None:
    engine = create_engine(database_url, schema, options)
    try:
        await upgrade_engine(engine)
    finally:
        await engine.dispose()


def upgrade(database_url: str, schema: str | None = None, options: DatabaseOptions | None = None) -> None:
    """Bring the database to the latest schema (blocking; for the CLI)."""
    asyncio.run(upgrade_async(database_url, schema, options))


def main(
    argv: list[str] | None = None,
    default_url: str | None = None,
    schema: str | None = None,
    options: DatabaseOptions | None = None,
) -> int:
    """`default_url`, `schema`, `options` (pool, TLS): from the gateway's settings (gateway/cli.py)."""
    parser = argparse.ArgumentParser(prog="llmgw migrate", description="Upgrade the gateway database.")
    parser.add_argument("--database-url", default=default_url, help="default: LLMGW_DATABASE_URL / settings")
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("--database-url is required")
    upgrade(args.database_url, schema, options)
    print("database upgraded to head")
    return 0
