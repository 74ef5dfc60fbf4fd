"""Leases, budget reservations, fail-open shares and fail-closed 503s (throw-away redis-servers)."""

import asyncio
import time
import uuid

import orjson
import pytest

from core.context import Reply, Usage
from core.errors import OpenAIError, error_response
from core.models import DeploymentConfig, ModelConfig
from gateway.pipeline import chain
from policies.policy import Budget, Limits, Policy
from policies.ratelimit.buckets import Bucket, Spend
from policies.ratelimit.failover import FailoverLimiter
from policies.ratelimit.leases import LeaseKeeper
from policies.ratelimit.local_limiter import LocalLimiter
from policies.ratelimit.redis_limiter import RedisLimiter
from policies.ratelimit.replicas import ReplicaCount
from policies.ratelimit.resp import RespPool
from policies.ratelimit.responses import rejection
from tests.policies_support import Database, make_settings, provision, redis_prefix_fixture, start  # noqa: F401
from tests.redis_servers import redis_servers
from tests.test_ratelimit_stage import chat, pipeline

DEAD_URL = "redis://127.0.0.1:16389/0"  # nothing listens there
LEASE_S = 1.5


@pytest.fixture
def server(tmp_path):
    with redis_servers(1, tmp_path, first_port=16382) as started:
        yield started[0]


@pytest.fixture
async def redis_limiters(server):
    made: list[RedisLimiter] = []

    def make(timeout_s: float = 2.0, lease_s: float = LEASE_S) -> RedisLimiter:
        made.append(RedisLimiter(RespPool.from_url(server.url, timeout_s), "t:", 60, lease_s))
        return made[-1]

    yield make
    for limiter in made:
        await limiter.aclose()


def slot(limit: int = 1) -> Bucket:
    return Bucket("concurrency", "k:1:inflight", "acme", limit, 1, "key 1")


def budget(cost: float, limit: float = 0.0002) -> Bucket:
    return Bucket("budget", "t:usd:d:2026-01-01", "acme", limit, cost, "tenant acme", retry_hint_s=3600)


def member() -> str:
    return uuid.uuid4().hex


async def _wait_admitted(limiter: RedisLimiter, buckets: list[Bucket], timeout_s: float) -> float:
    started = time.monotonic()
    while not (await limiter.admit(member(), buckets)).admitted:
        assert time.monotonic() - started < timeout_s, f"still refused after {timeout_s}s"
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def test_a_dead_replicas_slot_frees_within_one_lease(redis_limiters):
    dead, alive = redis_limiters(), redis_limiters()
    assert (await dead.admit(member(), [slot()])).admitted
    await dead.aclose()  # killed mid-request: no settlement, no renewal
    assert not (await alive.admit(member(), [slot()])).admitted
    assert await _wait_admitted(alive, [slot()], timeout_s=LEASE_S + 3) <= LEASE_S + 3


async def test_a_running_request_keeps_its_slot_past_the_lease(redis_limiters):
    holder, other = redis_limiters(), redis_limiters()
    keeper = LeaseKeeper(holder, LEASE_S)
    held = member()
    assert (await holder.admit(held, [slot()])).admitted
    keeper.hold(held, [slot()])
    try:
        await asyncio.sleep(LEASE_S * 2.5)
        assert not (await other.admit(member(), [slot()])).admitted
    finally:
        keeper.release(held)
        await keeper.aclose()
    await holder.settle(held, [slot()], 0, [])
    await holder.drain()
    assert (await other.admit(member(), [slot()])).admitted


async def test_budget_reservations_bound_a_burst_across_two_limiters(redis_limiters):
    cost, limit = 0.00002, 0.0002
    first, second = redis_limiters(), redis_limiters()
    members = [member() for _ in range(200)]
    decisions = await asyncio.gather(
        *((first if i % 2 else second).admit(m, [budget(cost)]) for i, m in enumerate(members))
    )
    admitted = [m for m, d in zip(members, decisions, strict=True) if d.admitted]
    assert len(admitted) >= 10 and len(admitted) * cost <= limit + cost * 1.001  # over ≤ one request
    spend = [Spend("t:usd:d:2026-01-01", "acme", cost, 3600)]
    for m in admitted:  # settlement swaps each reservation for the real cost
        await first.settle(m, [budget(cost)], 0, spend)
    await first.drain()
    refused = await second.admit(member(), [budget(cost)])
    assert not refused.admitted and refused.states[0].used == pytest.approx(cost * len(admitted))
    message = rejection(refused).message
    assert "of $0.0002 " in message and "$0.00 " not in message


async def test_a_cheap_settlement_frees_the_rest_of_the_reservation(redis_limiters):
    limiter = redis_limiters()
    first = member()
    second = member()
    assert (await limiter.admit(first, [budget(0.00015)])).admitted
    assert (await limiter.admit(second, [budget(0.00015)])).admitted  # 0.00015 in flight < 0.0002
    assert not (await limiter.admit(member(), [budget(0.00015)])).admitted  # 0.0003 in flight
    for held in (first, second):  # each really cost $0.00001
        await limiter.settle(held, [budget(0.00015)], 0, [Spend("t:usd:d:2026-01-01", "acme", 0.00001, 3600)])
    await limiter.drain()
    assert (await limiter.admit(member(), [budget(0.0)])).states[0].used == pytest.approx(0.00002)


async def test_settlement_does_not_wait_for_redis(server, redis_limiters):
    limiter = redis_limiters(timeout_s=3.0)
    held = member()
    assert (await limiter.admit(held, [slot()])).admitted
    server.pause()
    try:
        started = time.monotonic()
        await limiter.settle(held, [slot()], 0, [])
        assert time.monotonic() - started < 1.0  # queued; a wait for the reply would take 3 s here
    finally:
        server.resume()
    await limiter.drain()
    with server.client() as client:
        assert client.zcard("t:{acme}:k:1:inflight") == 0


async def test_fail_open_holds_each_replica_to_its_share():
    limiter = FailoverLimiter(
        RedisLimiter(RespPool.from_url(DEAD_URL, 0.05), "t:", 60, 30),
        LocalLimiter(60, 30),
        "open",
        0.5,
        ReplicaCount(None, "", fixed=2, interval_s=1.0),
    )
    rpm = Bucket("requests", "k:1:rpm", "acme", 10, 1, "key 1")
    decisions = [await limiter.admit(member(), [rpm]) for _ in range(8)]
    assert [d.admitted for d in decisions] == [True] * 5 + [False] * 3
    assert decisions[-1].failed is not None and decisions[-1].failed.bucket.limit == 5
    await limiter.aclose()


async def test_replicas_are_counted_by_heartbeat(server):
    pools = [RespPool.from_url(server.url, 2.0) for _ in range(2)]
    counts = [ReplicaCount(pool, "t:replicas", None, 1.0) for pool in pools]
    try:
        await counts[0].beat()
        assert counts[0]() == 1
        await counts[1].beat()
        await counts[0].beat()
        assert [count() for count in counts] == [2, 2]
    finally:
        for pool in pools:
            pool.close()


async def test_a_redis_restart_does_not_shrink_the_count_at_once(server):
    """After a restart the heartbeat set is empty: the first replica to beat must not count itself alone,
    or a second outage gives it the whole limit (an outside audit: 15 of an rpm of 10 admitted)."""
    pools = [RespPool.from_url(server.url, 2.0) for _ in range(2)]
    counts = [ReplicaCount(pool, "t:replicas", None, 1.0) for pool in pools]
    try:
        for count in (*counts, *counts):
            await count.beat()
        assert [count() for count in counts] == [2, 2]
        with server.client() as client:
            client.flushall()  # what a restart without persistence leaves
        await counts[0].beat()
        assert counts[0]() == 2  # the other replica was seen within three intervals
    finally:
        for pool in pools:
            pool.close()


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_policy_failure_mode_through_the_stage(tmp_path, mode):
    settings = make_settings(Database(f"sqlite+aiosqlite:///{tmp_path}/t.db", None), "llmgw-test:dead:")
    settings.redis_url = DEAD_URL  # Redis away from the start (the process default is fail-open)
    services = await start(settings)
    try:
        policy = Policy(key_limits=Limits(rpm=5), key_budget=Budget(usd_per_day=1), redis_failure_mode=mode)
        _, secret = await provision(services, policy)
        if mode == "open":
            reply = await pipeline(services)(chat(secret))
            assert reply.headers["x-ratelimit-remaining-requests"] == "4"
            return
        with pytest.raises(OpenAIError) as refused:
            await pipeline(services)(chat(secret))
        response = error_response(refused.value)
        assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
        error = orjson.loads(response.body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "service_unavailable_error" and error["code"] == "rate_limit_unavailable"
    finally:
        await services.aclose()


async def test_budget_reserves_the_estimated_cost_of_requests_in_flight(tmp_path, redis_prefix):
    deployment = DeploymentConfig(name="d1", base_url="http://127.0.0.1:9/v1", model="m",
                                  input_price_per_1m=1000, output_price_per_1m=1000)  # fmt: skip
    settings = make_settings(Database(f"sqlite+aiosqlite:///{tmp_path}/t.db", None), redis_prefix)
    settings.models = [ModelConfig(name="m", deployments=[deployment])]
    services = await start(settings)
    release = asyncio.Event()

    async def slow_backend(ctx, call_next):
        await release.wait()
        ctx.usage, ctx.cost_usd = Usage(14, 6), 0.02  # $0.001 a token
        return Reply(body={"ok": True})

    try:
        _, secret = await provision(services, Policy(key_budget=Budget(usd_per_day=0.2)))
        handler = chain([*services.stages, slow_backend])
        # each reserves (14 prompt + 50 max_tokens) × $0.001 = $0.064: admitted at $0, 0.064, 0.128, 0.192
        calls = [asyncio.create_task(handler(chat(secret, max_tokens=50))) for _ in range(20)]
        await asyncio.sleep(0.5)
        release.set()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert sum(not isinstance(o, Exception) for o in outcomes) == 4
        refused = next(o for o in outcomes if isinstance(o, OpenAIError))
        assert refused.status == 429 and "of $0.20 " in refused.message
        await services.ratelimit_stage.drain()
        assert isinstance(await handler(chat(secret, max_tokens=50)), Reply)  # spent $0.08 now
    finally:
        await services.aclose()
