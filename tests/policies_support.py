"""Shared fixtures of the policies tests (import `database_fixture` / `redis_prefix_fixture`): a database per test (SQLite file or a fresh PostgreSQL
schema), a unique Redis key prefix per test (only that prefix is flushed), and helpers."""

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest
import redis
from fastapi import FastAPI
from sqlalchemy import text

from gateway.settings import Settings
from policies.config import PoliciesSettings
from policies.db import create_engine
from policies.policy import Policy
from policies.service import PolicyServices, create_policy_services

POSTGRES_URL = os.environ.get("LLMGW_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ADMIN_TOKEN = "admin-test-token"
MASTER_KEY = "sk-test-master"


@dataclass(frozen=True)
class Database:
    url: str
    schema: str | None


@pytest.fixture(params=["sqlite", "postgresql"], name="database")
async def database_fixture(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Database]:
    if request.param == "sqlite":
        yield Database(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}", None)
        return
    schema = f"llmgw_test_{uuid.uuid4().hex[:12]}"
    await _postgres(f"CREATE SCHEMA {schema}")
    try:
        yield Database(POSTGRES_URL, schema)
    finally:
        await _postgres(f"DROP SCHEMA {schema} CASCADE")


async def _postgres(statement: str) -> None:
    engine = create_engine(POSTGRES_URL)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


@pytest.fixture(name="redis_prefix")
def redis_prefix_fixture() -> Iterator[str]:
    prefix = f"llmgw-test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=prefix + "*", count=1000):
        client.delete(key)
    client.close()


def make_settings(db: Database, redis_prefix: str | None = None, **policies: object) -> Settings:
    config = PoliciesSettings(
        db_schema=db.schema, auto_migrate=True, redis_prefix=redis_prefix or "llmgw:", **policies
    )
    return Settings(
        database_url=db.url,
        redis_url=REDIS_URL if redis_prefix else None,
        master_key=MASTER_KEY,
        admin_token=ADMIN_TOKEN,
        policies=config,
        models=[],
    )


async def start(settings: Settings) -> PolicyServices:
    return await create_policy_services(settings.policies, settings.connections(), settings.models)


async def provision(services: PolicyServices, policy: Policy, tenant: str = "acme") -> tuple[str, str]:
    """A tenant with `policy` and one key; returns (key id, secret)."""
    row = await services.store.create_policy(f"policy-{uuid.uuid4().hex[:6]}", policy)
    await services.store.create_tenant(tenant, tenant.title(), row.id)
    key, new = await services.store.create_key(tenant, "test")
    await services.notifier.changed()
    return key.id, new.secret


async def wait_until(predicate, timeout_s: float = 2.0) -> float:
    """Polls `predicate` until true; returns the seconds it took (fails the test on timeout)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not predicate():
        if loop.time() - started > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.01)
    return loop.time() - started


@asynccontextmanager
async def admin_client(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, PolicyServices]]:
    """The admin API alone, in-process: a client to it and the services behind it (closed after)."""
    services = await start(settings)
    app = FastAPI()
    app.include_router(services.admin_router)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield client, services
    finally:
        await services.aclose()
