"""Admission across gateway replicas through a real Redis: shares of a pool's slots and tenants' served
tokens are exchanged, and a replica that stops publishing (dead) frees its share when its record expires."""

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from routing.admission.admission import Admission
from routing.admission.capacity import Slots
from routing.admission.config import AdmissionSettings
from routing.admission.fair import Ticket
from routing.admission.fleet import FleetSync
from routing.admission.metrics import AdmissionMetrics
from tests.policies_support import REDIS_URL


def replica(settings: AdmissionSettings) -> Admission:
    admission = Admission(settings, lambda: {}, AdmissionMetrics(), stale_s=5.0)
    gate = admission.gate("pool")
    gate._capacity = lambda: Slots(10.0)  # a pool of ten slots, seen alike by both replicas
    return admission


def ticket(tenant: str, service: str, loop_time: float) -> Ticket:
    return Ticket(tenant, service, 1.0, 100.0, loop_time + 60, loop_time)  # type: ignore[arg-type]


async def test_replicas_share_a_pool_and_a_dead_one_frees_its_share() -> None:
    settings = AdmissionSettings(sync_interval_s=0.05, replica_ttl_s=0.5)
    redis = Redis.from_url(REDIS_URL)
    prefix = f"llmgw-test-{uuid.uuid4().hex[:8]}:"
    a, b = replica(settings), replica(settings)
    sync_a, sync_b = FleetSync(a, redis, prefix, "a"), FleetSync(b, redis, prefix, "b")
    now = asyncio.get_running_loop().time()
    tickets = [ticket("batch-tenant", "batch", now) for _ in range(20)]
    waiting = [asyncio.create_task(a.gate("pool").admit(t)) for t in tickets]
    await asyncio.sleep(0)
    assert a.gates["pool"].running["batch"] == 9  # alone: the batch class's share of the pool
    for _ in range(10):  # b runs interactive requests of its own (its admit does not wait: room)
        await b.gate("pool").admit(ticket("chat-tenant", "interactive", now))
    await sync_b.sync()
    await sync_a.sync()
    gate = a.gates["pool"]
    assert gate.others == {"interactive": 10.0, "batch": 0.0, "standard": 0.0} and gate.others_running == 10
    assert gate.ledger.others == {"chat-tenant": pytest.approx(1000.0)}  # b's served tokens, for fair shares
    assert gate.allowance()["batch"] == 0  # the interactive demand elsewhere holds the pool
    for t in [t for t in tickets if t.started is not None][:5]:
        gate.release(t, 100)
    assert gate.running["batch"] == 4  # the freed slots are not taken: b's interactive requests hold them
    # b dies: it stops publishing; after its record expires, a admits on its own again
    sync_a.start()
    await asyncio.sleep(settings.replica_ttl_s + 0.3)
    assert gate.others_running == 0 and gate.others.get("interactive", 0) == 0
    assert gate.running["batch"] == 9  # its tick started the batch requests the dead replica held back
    await sync_a.aclose()
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert await redis.exists(f"{prefix}adm:pool:r:a") == 0  # a left at once on close
    await redis.aclose()
