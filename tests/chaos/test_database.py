"""PostgreSQL away under load: keys and policies are served from memory, usage records wait in the
buffer and are all written once the database is back (rows = answers)."""

import asyncio
import os

import pytest

from tests.chaos.conftest import Fleet, metric
from tests.chaos.database import settled_rows
from tests.chaos.load import chat, run_load
from tests.chaos.processes import PostgresCluster

pytestmark = pytest.mark.chaos
OUTAGE_S = float(os.environ.get("LLMGW_CHAOS_PG_OUTAGE_S", "8"))  # the 60 s: set it to 60


async def test_postgres_stopped_and_started_under_load(fleet: Fleet, postgres: PostgresCluster) -> None:
    key = fleet.keys["database"]
    load = asyncio.create_task(
        run_load(fleet.urls, key.secret, lambda i: chat(f"hello {i}", stream=i % 3 == 0), OUTAGE_S + 5, 4)
    )
    await asyncio.sleep(1.5)
    await asyncio.to_thread(postgres.stop)
    try:
        await asyncio.sleep(OUTAGE_S)
        buffered = sum([await metric(url, "llmgw_usage_records_buffered") for url in fleet.urls])
    finally:
        await asyncio.to_thread(postgres.start)
    result = await load
    print(f"PostgreSQL away {OUTAGE_S}s: {result.summary()}, {buffered:.0f} records buffered at the end")

    assert result.server_errors() == [], result.summary()
    assert result.complete() == len(result.outcomes), result.summary()
    assert result.latency(0.99) < 2.0, result.summary()
    assert buffered > 0  # the outage was real: records waited
    rows = await settled_rows(postgres, fleet.schema, key.key_id, len(result.outcomes))
    assert rows == {200: len(result.outcomes)}
    for url in fleet.urls:
        assert await metric(url, "llmgw_usage_records_buffered") == 0
