"""Backend faults: a deployment killed in the middle of streams, a deployment slower than its timeout.

Documented outcomes: a stream already answering (status 200 sent) when its backend dies ends with an
OpenAI-style error event and no [DONE]; a request with no deployment left that answers in time gets
504. Everything else is served by the remaining deployments."""

import asyncio
import time

import httpx
import pytest

from tests.chaos.conftest import Fleet
from tests.chaos.database import settled_rows
from tests.chaos.load import chat, run_load, send
from tests.chaos.processes import PostgresCluster, Upstream

pytestmark = pytest.mark.chaos


async def test_backend_killed_mid_stream(
    fleet: Fleet, upstreams: dict[str, Upstream], postgres: PostgresCluster
) -> None:
    key = fleet.keys["backend"]
    words = " ".join(f"w{i}" for i in range(20))
    load = asyncio.create_task(
        run_load(fleet.urls, key.secret, lambda i: chat(f"slow-stream:0.1 {words}", stream=True), 6, 6)
    )
    await asyncio.sleep(1.5)
    killed_at = time.monotonic()
    await asyncio.to_thread(upstreams["a"].kill)
    try:
        result = await load
    finally:
        await asyncio.to_thread(upstreams["a"].start)
    print(f"deployment killed mid-stream: {result.summary()}")

    cut = [o for o in result.outcomes if o.status == 200 and not o.done]
    assert result.server_errors() == [], result.summary()
    assert all(o.error_code for o in cut)  # a cut stream says so, in an error event
    assert all(o.started < killed_at for o in cut)  # later requests went to the live deployment
    assert sum(o.started > killed_at + 0.5 for o in result.outcomes) > 0
    assert result.latency(1.0) < 10.0, result.summary()  # no stream hangs on its dead backend
    rows = await settled_rows(postgres, fleet.schema, key.key_id, len(result.outcomes))
    assert sum(rows.values()) == len(result.outcomes)
    assert rows.get(200, 0) == result.complete()


async def test_slow_backend(fleet: Fleet) -> None:
    key = fleet.keys["backend"]
    async with httpx.AsyncClient(timeout=30) as client:
        with_fallback = await asyncio.gather(*(send(client, fleet.urls[i % 2], key.secret, chat("hi", model="slow"))
                                               for i in range(4)))  # fmt: skip
        without = await asyncio.gather(*(send(client, fleet.urls[i % 2], key.secret, chat("hi", model="slow-only"))
                                         for i in range(4)))  # fmt: skip
    print("slow backend:", [(o.status, round(o.latency_s, 2)) for o in with_fallback + without])
    assert all(o.status == 200 and o.latency_s < 5 for o in with_fallback)  # read timeout 1 s, then "m"
    assert all(o.status == 504 and o.latency_s < 5 for o in without)  # documented: timed out, nothing left
