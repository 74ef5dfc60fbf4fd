"""SIGTERM under load, with one worker and with --workers 2: readiness fails at once, the listener
closes, in-flight requests and streams finish (a stream past the grace period ends with an error
event), every usage record is written, and the process exits 0.

Documented: requests sent after the signal are refused at connect time (clients retry elsewhere)."""

import asyncio
import time

import httpx
import pytest

from tests.chaos.database import new_schema, usage_rows
from tests.chaos.load import chat, run_load, send
from tests.chaos.processes import MASTER_KEY, Gateway, PostgresCluster, Upstream, deployment, gateway_env

pytestmark = pytest.mark.chaos
GRACE_S = 4.0


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_under_load(workers: int, postgres: PostgresCluster, upstreams: dict[str, Upstream],
                                  tmp_path) -> None:  # fmt: skip
    schema = await asyncio.to_thread(new_schema, postgres)
    models = [{"name": "m", "deployments": [deployment("fake-a", upstreams["a"])]}]
    env = gateway_env(postgres.url, schema, models, LLMGW_SHUTDOWN_GRACE_S=str(GRACE_S))
    gateway = await asyncio.to_thread(lambda: Gateway(env, workers, tmp_path).spawn().wait_ready())
    try:
        await _sigterm_under_load(gateway, postgres, schema)
    finally:
        gateway.kill()


async def _sigterm_under_load(gateway: Gateway, postgres: PostgresCluster, schema: str) -> None:
    def body(i: int) -> dict:  # streams of ~1 s and answers after 0.5 s: all finish within the grace period
        return chat("slow-stream:0.1 a b c d e f g h", stream=True) if i % 2 else chat("sleep:0.5")

    load = asyncio.create_task(run_load([gateway.url], MASTER_KEY, body, 4, 6))
    async with httpx.AsyncClient(timeout=60) as client:
        words = " ".join(f"w{i}" for i in range(100))  # ~10 s: longer than the grace period
        too_long = asyncio.create_task(
            send(client, gateway.url, MASTER_KEY, chat(f"slow-stream:0.1 {words}", True))
        )
        await asyncio.sleep(2)
        signalled = time.monotonic()
        exit_code = asyncio.create_task(asyncio.to_thread(gateway.terminate, 60))
        ready = await _readiness_after(client, gateway.url, signalled + 1.0)
        result, cut, code = await load, await too_long, await exit_code
    stopped_s = time.monotonic() - signalled
    print(f"SIGTERM, {gateway.workers} worker(s): exit {code} after {stopped_s:.1f}s; {result.summary()}; "
          f"long stream: {cut.status} done={cut.done} error={cut.error_code}")  # fmt: skip

    assert code == 0 and stopped_s < GRACE_S + 15  # the grace period, then the usage flush and clean-up
    assert ready[0] != 200  # within 1 s of the signal: 503, then the listener is gone
    assert ready[1] < 1.5  # refused or answered, not left waiting in a backlog nobody accepts from
    in_flight = [o for o in result.outcomes if o.started < signalled - 0.3]
    assert in_flight and all(o.complete for o in in_flight), result.summary()
    late = [o for o in result.outcomes if o.started >= signalled - 0.3]
    assert all(o.complete or o.status == 0 for o in late), result.summary()  # refused at connect, or served
    assert cut.status == 200 and not cut.done and cut.error_code == "server_shutting_down"
    rows = await usage_rows(postgres, schema)  # written before the exit
    answered = [o for o in [*result.outcomes, cut] if o.status]
    assert rows.get(200, 0) == sum(o.complete for o in answered)
    assert sum(rows.values()) == len(answered)


async def _readiness_after(client: httpx.AsyncClient, url: str, deadline: float) -> tuple[int | None, float]:
    """/health/ready's status at `deadline` (None: the connection was refused) and how long it took."""
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    started = time.monotonic()
    try:
        status: int | None = (await client.get(url + "/health/ready", timeout=10)).status_code
    except httpx.HTTPError:
        status = None
    return status, time.monotonic() - started
