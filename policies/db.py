"""The async database engine of this package (SQLite or PostgreSQL)."""

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine


def is_sqlite(database_url: str) -> bool:
    return database_url.startswith("sqlite")


def create_engine(database_url: str, schema: str | None = None) -> AsyncEngine:
    """An engine; `schema` sets PostgreSQL's search_path (one schema per deployment or test run)."""
    connect_args: dict[str, Any] = {}
    if schema and not is_sqlite(database_url):
        connect_args["server_settings"] = {"search_path": schema}
    engine = create_async_engine(database_url, connect_args=connect_args, pool_pre_ping=True)
    if is_sqlite(database_url):
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def session_factory(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)
