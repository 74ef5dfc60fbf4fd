"""The data model against SQLite and PostgreSQL: migrations, CRUD, hashed keys, usage records."""

import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from policies.errors import Conflict, NotFound
from policies.policy import Budget, Limits, Policy
from policies.ratelimit.local_limiter import LocalLimiter
from policies.ratelimit.seed import seed_spend
from policies.tables import ApiKeyRow, utcnow
from policies.usage_query import aggregate_usage
from tests.policies_support import database_fixture, make_settings, start  # noqa: F401


async def test_migrations_create_every_table(database):
    services = await start(make_settings(database))
    try:
        async with services.engine.connect() as conn:
            for table in (
                "tenants",
                "api_keys",
                "policies",
                "model_aliases",
                "usage_records",
                "alembic_version",
            ):
                assert (await conn.execute(text(f"SELECT COUNT(*) FROM {table}"))).scalar() is not None
    finally:
        await services.aclose()


async def test_crud_and_keys_stored_only_as_hash(database):
    services = await start(make_settings(database))
    store = services.store
    try:
        policy = await store.create_policy("gold", Policy(key_limits=Limits(rpm=10), allowed_models=["m"]))
        await store.create_tenant("acme", "Acme", policy.id)
        key, new = await store.create_key("acme", "ci")
        assert new.secret.startswith(new.prefix) and len(new.secret) > 40
        async with services.engine.connect() as conn:
            dump = " ".join(str(row) for row in await conn.execute(select(ApiKeyRow.__table__)))
        assert new.secret not in dump
        assert hashlib.sha256(new.secret.encode()).hexdigest() in dump
        await services.directory.reload()
        entry = services.directory.lookup(hashlib.sha256(new.secret.encode()).hexdigest())
        assert entry.principal.tenant_id == "acme" and entry.policy.key_limits.rpm == 10
        await store.revoke_key(key.id)
        await services.directory.reload()
        assert services.directory.lookup(new.key_hash) is None
    finally:
        await services.aclose()


async def test_conflicts_and_missing_objects(database):
    services = await start(make_settings(database))
    store = services.store
    try:
        policy = await store.create_policy("p", Policy())
        await store.create_tenant("acme", "Acme", policy.id)
        with pytest.raises(Conflict):
            await store.create_tenant("acme", "Again", None)
        with pytest.raises(Conflict):
            await store.create_policy("p", Policy())
        with pytest.raises(Conflict):
            await store.delete_policy(policy.id)  # still used by the tenant
        with pytest.raises(NotFound):
            await store.create_key("nobody")
        with pytest.raises(NotFound):
            await store.create_tenant("x", "X", "pol_missing")
        await store.delete_tenant("acme")
        await store.delete_policy(policy.id)
        assert await store.list_policies() == []
    finally:
        await services.aclose()


async def test_usage_records_are_batched_aggregated_and_reload_spend(database):
    services = await start(make_settings(database))
    try:
        now = utcnow()
        for i in range(5):
            services.usage.submit(_record(now, key=f"k{i % 2}", cost=0.5, prompt=10))
        services.usage.submit(_record(now - timedelta(days=40), key="k0", cost=100.0, prompt=1))
        await services.usage.flush()
        rows = await aggregate_usage(services.engine, ["key_id"], start=now - timedelta(days=1))
        assert [(r["key_id"], r["requests"], r["prompt_tokens"]) for r in rows] == [
            ("k0", 3, 30),
            ("k1", 2, 20),
        ]
        assert rows[0]["cost_usd"] == pytest.approx(1.5)
        limiter = LocalLimiter(60, 60)
        await seed_spend(services.engine, limiter, datetime.now(UTC))
        assert limiter._spent("acme\x00t:usd:" + f"d:{now:%Y-%m-%d}", now.timestamp() + 1) == pytest.approx(
            2.5
        )
    finally:
        await services.aclose()


def _record(ts: datetime, key: str, cost: float, prompt: int) -> dict:
    return {
        "ts": ts,
        "request_id": "r",
        "tenant_id": "acme",
        "key_id": key,
        "model": "m",
        "deployment": "d",
        "endpoint": "chat",
        "status": 200,
        "prompt_tokens": prompt,
        "completion_tokens": 1,
        "cached_tokens": 0,
        "cost_usd": cost,
        "latency_ms": 3.0,
        "cache_status": "miss",
    }


async def test_budget_policy_validation_rejects_bad_values():
    with pytest.raises(ValueError):
        Policy(key_budget=Budget(usd_per_day=-1))
    with pytest.raises(ValueError):
        Policy(unknown_field=1)
