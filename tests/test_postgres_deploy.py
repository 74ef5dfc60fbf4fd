"""PostgreSQL as operators run it: the migration safe to run concurrently (advisory lock), libpq's sslmode
and sslrootcert honoured (from the URL or the settings), the pool sized by the settings. Against the local
PostgreSQL (127.0.0.1:5432, database `test`), in a database made for this test."""

import asyncio
import ssl
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text

from policies.config import DatabaseOptions, PoliciesSettings
from policies.db import create_engine, postgres_tls
from tests.policies_support import POSTGRES_URL

pytestmark = pytest.mark.timeout(60)
SERVER = POSTGRES_URL.rsplit("/", 1)[0]  # postgresql+asyncpg://postgres@127.0.0.1:5432


@pytest.fixture
async def fresh_database() -> AsyncIterator[str]:
    name = f"llmgw_migrate_{uuid.uuid4().hex[:10]}"
    admin_dsn = POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://")
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield f"{SERVER}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


MIGRATE_ONCE = """
import asyncio, sys
from policies.db import create_engine
from policies.migrate import upgrade_engine

async def main():
    engine = create_engine(sys.argv[1])
    try:
        await upgrade_engine(engine, attempts=1)  # no retry: a race would fail here
    finally:
        await engine.dispose()

asyncio.run(main())
"""


async def test_concurrent_migrations_on_a_fresh_database_all_succeed(fresh_database):
    """Five `llmgw migrate` processes at once (a Job and replicas starting together), none retried: the
    advisory lock lets one create the schema; the others wait and find it at head."""
    runs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            MIGRATE_ONCE,
            fresh_database,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        for _ in range(5)
    ]
    outputs = await asyncio.gather(*(run.communicate() for run in runs))
    failed = [out.decode()[-600:] for run, (out, _) in zip(runs, outputs, strict=True) if run.returncode != 0]
    assert failed == []
    engine = create_engine(fresh_database)
    try:
        async with engine.connect() as conn:
            versions = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
            tables = (
                await conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"))
            ).scalar()
        assert len(versions) == 1 and tables > 1
    finally:
        await engine.dispose()


async def test_sslmode_in_the_url_is_honoured(fresh_database):
    """This PostgreSQL has TLS off: `disable` connects, `require` is refused (asyncpg used to reject the
    parameter itself: sslmode was never applied)."""
    plain = create_engine(fresh_database + "?sslmode=disable")
    try:
        async with plain.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await plain.dispose()
    required = create_engine(fresh_database + "?sslmode=require")
    try:
        with pytest.raises(Exception, match="(?i)ssl|tls"):
            async with required.connect() as conn:
                await conn.execute(text("SELECT 1"))
    finally:
        await required.dispose()


def test_sslmode_and_root_certificate_make_the_tls_context(tmp_path: Path):
    from tests.redis_deploy_servers import make_certificates

    certs = make_certificates(tmp_path)
    full = postgres_tls("verify-full", certs.ca, None, None)
    assert isinstance(full, ssl.SSLContext) and full.check_hostname and full.verify_mode == ssl.CERT_REQUIRED
    ca = postgres_tls("verify-ca", certs.ca, None, None)
    assert isinstance(ca, ssl.SSLContext) and not ca.check_hostname and ca.verify_mode == ssl.CERT_REQUIRED
    required = postgres_tls("require", None, None, None)
    assert isinstance(required, ssl.SSLContext) and required.verify_mode == ssl.CERT_NONE
    assert postgres_tls("require", certs.ca, None, None).verify_mode == ssl.CERT_REQUIRED  # type: ignore[union-attr]
    assert postgres_tls("disable", None, None, None) is False
    assert postgres_tls("prefer", None, None, None) == "prefer"
    assert postgres_tls(None, None, None, None) is None
    with pytest.raises(FileNotFoundError):  # a missing root certificate fails at start
        postgres_tls("verify-full", tmp_path / "missing.crt", None, None)


async def test_settings_win_over_the_url_and_size_the_pool(fresh_database):
    options = PoliciesSettings(database={"sslmode": "disable", "pool_size": 3, "max_overflow": 2}).database
    assert isinstance(options, DatabaseOptions)
    engine = create_engine(fresh_database + "?sslmode=require", options=options)
    try:
        async with engine.connect() as conn:  # the setting's `disable` won over the URL's `require`
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
        assert engine.pool.size() == 3 and engine.pool._max_overflow == 2  # type: ignore[attr-defined]
    finally:
        await engine.dispose()
