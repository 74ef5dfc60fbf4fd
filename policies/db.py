"""The async database engine of this package (SQLite or PostgreSQL).

PostgreSQL TLS follows libpq's `sslmode` (disable, allow, prefer, require, verify-ca, verify-full) and
`sslrootcert` / `sslcert` / `sslkey`, from the URL's query or the typed settings (DatabaseOptions, which
win); asyncpg takes none of them itself, so they become its `ssl` argument here. As with libpq, `require`
with a root certificate verifies the chain (verify-ca).
"""

import ssl
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from policies.config import DatabaseOptions, SslMode

_TLS_PARAMS = ("sslmode", "sslrootcert", "sslcert", "sslkey")


def is_sqlite(database_url: str) -> bool:
    return database_url.startswith("sqlite")


def create_engine(
    database_url: str, schema: str | None = None, options: DatabaseOptions | None = None
) -> AsyncEngine:
    """An engine; `schema` sets PostgreSQL's search_path (one schema per deployment or test run)."""
    options = options or DatabaseOptions()
    if is_sqlite(database_url):
        engine = create_async_engine(database_url, pool_pre_ping=True)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    url = make_url(database_url)
    query = {k: v if isinstance(v, str) else v[-1] for k, v in url.query.items()}
    connect_args: dict[str, Any] = {}
    if schema:
        connect_args["server_settings"] = {"search_path": schema}
    tls = postgres_tls(
        options.sslmode or query.get("sslmode"),  # type: ignore[arg-type]
        options.sslrootcert or _path(query.get("sslrootcert")),
        options.sslcert or _path(query.get("sslcert")),
        options.sslkey or _path(query.get("sslkey")),
    )
    if tls is not None:
        connect_args["ssl"] = tls
    return create_async_engine(
        url.difference_update_query(_TLS_PARAMS),
        connect_args=connect_args,
        pool_pre_ping=True,
        pool_size=options.pool_size,
        max_overflow=options.max_overflow,
        pool_timeout=options.pool_timeout_s,
        pool_recycle=options.pool_recycle_s,
    )


def postgres_tls(
    mode: SslMode | None, rootcert: Path | None, cert: Path | None, key: Path | None
) -> bool | str | ssl.SSLContext | None:
    """asyncpg's `ssl` argument for libpq's settings (None: asyncpg's default, prefer)."""
    if mode is None and rootcert is None and cert is None:
        return None
    mode = mode or ("verify-full" if rootcert is not None else "prefer")
    if mode == "disable":
        return False
    if mode in ("allow", "prefer") and cert is None:
        return mode
    if mode not in ("allow", "prefer", "require", "verify-ca", "verify-full"):
        raise ValueError(
            f"unknown sslmode {mode!r} (disable, allow, prefer, require, verify-ca, verify-full)"
        )
    verify = mode in ("verify-ca", "verify-full") or (mode == "require" and rootcert is not None)
    context = (
        ssl.create_default_context(cafile=rootcert) if verify else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    )
    context.check_hostname = mode == "verify-full"
    context.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def session_factory(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)
