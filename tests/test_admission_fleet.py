"""Admission across gateway replicas through a real Redis: shares of a pool's slots and tenants' served
tokens are exchanged, and a replica that stops publishing (dead) frees its share when its record expires."""

import asyncio
import tempfile
import uuid
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from gateway.services import fleet_client
from gateway.settings import Settings
from policies.config import RedisOptions
from policies.redis_connect import redis_py_client
from routing.admission.admission import Admission
from routing.admission.capacity import Slots
from routing.admission.config import AdmissionSettings
from routing.admission.fair import Ticket
from routing.admission.fleet import FleetSync
from routing.admission.metrics import AdmissionMetrics
from tests.policies_support import REDIS_URL
from tests.redis_deploy_servers import redis_cluster


def replica(settings: AdmissionSettings) -> Admission:
    admission = Admission(settings, lambda: {}, AdmissionMetrics(), stale_s=5.0)
    gate = admission.gate("pool")
    gate._capacity = lambda: Slots(10.0)  # a pool of ten slots, seen alike by both replicas
    return admission


def two_replicas(
    settings: AdmissionSettings, clients: tuple[Redis, Redis]
) -> tuple[Admission, Admission, FleetSync, FleetSync]:
    """Replicas a and b of one pool, each syncing through its client under a fresh key prefix."""
    prefix = f"llmgw-test-{uuid.uuid4().hex[:8]}:"
    a, b = replica(settings), replica(settings)
    return a, b, FleetSync(a, clients[0], prefix, "a"), FleetSync(b, clients[1], prefix, "b")


def ticket(tenant: str, service: str, loop_time: float) -> Ticket:
    return Ticket(tenant, service, 1.0, 100.0, loop_time + 60, loop_time)  # type: ignore[arg-type]


async def test_replicas_share_a_pool_and_a_dead_one_frees_its_share() -> None:
    settings = AdmissionSettings(sync_interval_s=0.05, replica_ttl_s=0.5)
    redis = Redis.from_url(REDIS_URL)
    a, b, sync_a, sync_b = two_replicas(settings, (redis, redis))
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
    assert await redis.exists(sync_a._record_key("pool", "a")) == 1  # a publishes
    await sync_a.aclose()
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert await redis.exists(sync_a._record_key("pool", "a")) == 0  # a left at once on close
    await redis.aclose()


async def test_weights_hold_across_replicas_whatever_the_queues() -> None:
    """Tenants of weights 2 : 1, each behind its own replica, both asking more than the pool: once the
    replicas exchange their tenants' demand, the standard class's slots go 2 : 1 between them (by queue
    length, 1 : 2 here), and so do the requests they start as slots free."""
    settings = AdmissionSettings(sync_interval_s=0.05, replica_ttl_s=2.0)
    redis = Redis.from_url(REDIS_URL)
    a, b, sync_a, sync_b = two_replicas(settings, (redis, redis))
    now = asyncio.get_running_loop().time()
    heavy = [Ticket("heavy", "standard", 2.0, 100.0, now + 60, now) for _ in range(150)]
    light = [Ticket("light", "standard", 1.0, 100.0, now + 60, now) for _ in range(300)]
    waiting = [asyncio.create_task(a.gate("pool").admit(t)) for t in heavy]
    waiting += [asyncio.create_task(b.gate("pool").admit(t)) for t in light]
    await asyncio.sleep(0)
    gate_a, gate_b = a.gates["pool"], b.gates["pool"]
    released: set[int] = set()
    starts = []
    for _ in range(12):  # slots free on both replicas, the replicas sync, the freed slots are taken again
        for gate, tickets in ((gate_a, heavy), (gate_b, light)):
            for t in [t for t in tickets if t.started is not None and id(t) not in released]:
                released.add(id(t))
                gate.release(t, 100)
        await sync_a.sync()
        await sync_b.sync()
        starts.append((sum(t.started is not None for t in heavy), sum(t.started is not None for t in light)))
    assert gate_a.others_tenants["standard"]["light"][1] == 1.0
    # the class's 9 whole slots (10 × 0.95) go 6 : 3
    assert (gate_a.allowance()["standard"], gate_b.allowance()["standard"]) == (6, 3)
    (h0, l0), (h1, l1) = starts[2], starts[-1]  # after the first exchanges
    assert 1.6 <= (h1 - h0) / (l1 - l0) <= 2.4
    await sync_a.aclose()
    await sync_b.aclose()
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    await redis.aclose()


async def test_replicas_share_a_pool_through_a_redis_cluster() -> None:
    """The fleet's keys of a pool share one hash slot, so its pipelined round trip works on a 3-node Cluster
    (through the gateway's cluster client; a plain client there met MOVED and admitted alone)."""
    settings = AdmissionSettings(sync_interval_s=0.05, replica_ttl_s=2.0)
    with redis_cluster(Path(tempfile.mkdtemp(prefix="llmgw-fleet-cluster-"))) as nodes:
        url = f"redis://127.0.0.1:{nodes[0].port}"
        clients = [redis_py_client(url, RedisOptions(cluster=True), cluster_client=True) for _ in range(2)]
        a, b, sync_a, sync_b = two_replicas(settings, (clients[0], clients[1]))
        now = asyncio.get_running_loop().time()
        for _ in range(10):
            await b.gate("pool").admit(ticket("chat-tenant", "interactive", now))
        await sync_b.sync()
        await sync_a.sync()
        gate = a.gates["pool"]
        assert gate.others_running == 10 and gate.others["interactive"] == 10.0
        assert gate.others_tenants["interactive"] == {"chat-tenant": (10.0, 1.0)}
        slots = {key_slot(k.encode()) for k in (sync_a.members_key("pool"), sync_a._record_key("pool", "a"),
                                                   sync_b._record_key("pool", "b"))}  # fmt: skip
        assert len(slots) == 1  # one node per round trip
        await sync_a.aclose()
        await sync_b.aclose()
        for client in clients:
            await client.aclose()


def test_the_gateway_gives_the_fleet_a_cluster_client_on_a_cluster() -> None:
    shared = Redis.from_url(REDIS_URL)
    plain = Settings(redis_url=REDIS_URL)
    assert fleet_client(plain, shared) is shared
    cluster = Settings(redis_url="redis://127.0.0.1:7000", policies={"redis": {"cluster": True}})
    assert isinstance(fleet_client(cluster, shared), RedisCluster)
