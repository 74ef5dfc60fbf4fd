"""The chaos cluster's data: a schema per fleet or gateway, keys written before replicas start, usage rows."""

import asyncio
import time
import uuid
from dataclasses import dataclass

import asyncpg

from policies.db import create_engine, session_factory
from policies.migrate import upgrade_async
from policies.policy import Policy
from policies.store import Store
from tests.chaos.processes import PostgresCluster


@dataclass(frozen=True)
class Key:
    key_id: str
    secret: str


def new_schema(postgres: PostgresCluster) -> str:
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    asyncio.run(_execute(postgres, f"CREATE SCHEMA {schema}"))
    asyncio.run(upgrade_async(postgres.url, schema))
    return schema


async def provision(database_url: str, schema: str, policies: dict[str, Policy]) -> dict[str, Key]:
    """One tenant, policy and key per entry, written before the replicas start (they load them then)."""
    engine = create_engine(database_url, schema)
    store = Store(session_factory(engine))
    keys = {}
    try:
        for name, policy in policies.items():
            row = await store.create_policy(name, policy)
            await store.create_tenant(name, name, row.id)
            key, new = await store.create_key(name, name)
            keys[name] = Key(key.id, new.secret)
    finally:
        await engine.dispose()
    return keys


async def _execute(postgres: PostgresCluster, statement: str) -> None:
    conn = await asyncpg.connect(host="127.0.0.1", port=postgres.port, user="postgres", database="postgres")
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def usage_rows(postgres: PostgresCluster, schema: str, key_id: str | None = None) -> dict[int, int]:
    """Usage rows by status (of one key, or all)."""
    conn = await asyncpg.connect(host="127.0.0.1", port=postgres.port, user="postgres", database="postgres")
    try:
        where = "WHERE key_id = $1" if key_id else ""
        query = f"SELECT status, count(*) FROM {schema}.usage_records {where} GROUP BY status"
        rows = await conn.fetch(query, *([key_id] if key_id else []))
    finally:
        await conn.close()
    return {row[0]: row[1] for row in rows}


async def settled_rows(postgres: PostgresCluster, schema: str, key_id: str | None, expected: int,
                       timeout_s: float = 30.0) -> dict[int, int]:  # fmt: skip
    """The usage rows once their total reaches `expected` (or the timeout passes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = await usage_rows(postgres, schema, key_id)
        if sum(rows.values()) >= expected or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.25)
