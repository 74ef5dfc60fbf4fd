"""Provisioning outside a running gateway (CLI, benchmarks): a store on its own engine, and a
change announcement so running replicas reload at once."""

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

from redis.exceptions import RedisError

from policies.config import PoliciesSettings
from policies.db import create_engine, session_factory
from policies.errors import NotFound
from policies.migrate import upgrade_engine
from policies.policy import Policy
from policies.redis_connect import redis_py_client
from policies.store import Store


class StoreSettings(Protocol):
    """What provisioning reads of the settings (gateway.settings.Settings has it)."""

    database_url: str
    redis_url: str | None
    policies: PoliciesSettings


@asynccontextmanager
async def open_store(settings: StoreSettings, migrate: bool = True) -> AsyncIterator[Store]:
    engine = create_engine(settings.database_url, settings.policies.db_schema, settings.policies.database)
    try:
        if migrate:
            await upgrade_engine(engine)
        yield Store(session_factory(engine))
    finally:
        await engine.dispose()
    await announce_change(settings)


async def announce_change(settings: StoreSettings) -> None:
    """Tell running replicas to reload. The change is stored already: when Redis cannot be reached, a
    warning says so, and the replicas pick it up on their periodic refresh (`refresh_interval_s`)."""
    if settings.redis_url is None:
        return
    client = redis_py_client(settings.redis_url, settings.policies.redis)
    try:
        await client.publish(settings.policies.redis_prefix + "changes", "reload")
    except (RedisError, OSError) as exc:
        print(f"warning: stored, but running gateways were not told at once (Redis: {type(exc).__name__}); "
              f"they reload within {settings.policies.refresh_interval_s:g} s", file=sys.stderr)  # fmt: skip
    finally:
        await client.aclose()


async def ensure_tenant(store: Store, tenant_id: str, policy: Policy | None = None) -> None:
    """Create the tenant (with `policy`, if given) unless it exists."""
    try:
        await store.get_tenant(tenant_id)
    except NotFound:
        policy_id = (await store.create_policy(f"{tenant_id}-policy", policy)).id if policy else None
        await store.create_tenant(tenant_id, tenant_id, policy_id)


async def provision_virtual_key(settings: StoreSettings, tenant_id: str, policy: Policy | None = None) -> str:
    """A tenant (created with `policy` if missing) and a new key on it; returns the key's secret.

    For benchmarks: `await provision_virtual_key(settings, "bench", Policy(key_limits=Limits(rpm=10**9)))`.
    """
    async with open_store(settings) as store:
        await ensure_tenant(store, tenant_id, policy)
        _, new = await store.create_key(tenant_id, "provisioned")
    return new.secret
