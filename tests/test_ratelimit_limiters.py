"""Both limiters (Redis Lua and in-process) have the same exact semantics."""

import asyncio
import uuid

import pytest

from policies.ratelimit.buckets import Bucket, Spend
from policies.ratelimit.local_limiter import LocalLimiter
from policies.ratelimit.redis_limiter import RedisLimiter
from policies.ratelimit.resp import RespPool
from tests.policies_support import REDIS_URL, redis_prefix_fixture  # noqa: F401


@pytest.fixture(params=["local", "redis"])
async def make_limiter(request, redis_prefix):
    limiters = []

    def build(window_s: int = 60, lease_s: float = 60):
        if request.param == "local":
            return LocalLimiter(window_s, lease_s)
        limiters.append(RedisLimiter(RespPool.from_url(REDIS_URL, 5.0), redis_prefix, window_s, lease_s))
        return limiters[-1]

    yield build
    for limiter in limiters:
        await limiter.aclose()


def rpm(limit: int, name: str = "k:1:rpm") -> Bucket:
    return Bucket("requests", name, "acme", limit, 1, "key 1")


def tpm(limit: int, cost: int, name: str = "k:1:tpm") -> Bucket:
    return Bucket("tokens", name, "acme", limit, cost, "key 1")


def member() -> str:
    return uuid.uuid4().hex


async def test_requests_admitted_exactly_up_to_the_limit(make_limiter):
    limiter = make_limiter()
    decisions = [await limiter.admit(member(), [rpm(5)]) for _ in range(8)]
    assert [d.admitted for d in decisions] == [True] * 5 + [False] * 3
    assert decisions[4].states[0].used == 5
    rejected = decisions[5]
    assert rejected.failed.bucket.kind == "requests"
    assert 59 < rejected.failed.retry_s <= 60
    assert 59 < rejected.states[0].reset_s <= 60


async def test_window_rolls_over(make_limiter):
    limiter = make_limiter(window_s=1)
    assert (await limiter.admit(member(), [rpm(1)])).admitted
    assert not (await limiter.admit(member(), [rpm(1)])).admitted
    await asyncio.sleep(1.05)
    assert (await limiter.admit(member(), [rpm(1)])).admitted


async def test_tokens_reserved_then_settled_to_real_usage(make_limiter):
    limiter = make_limiter()
    first = member()
    assert (await limiter.admit(first, [tpm(1000, 800)])).admitted
    assert not (await limiter.admit(member(), [tpm(1000, 300)])).admitted
    await limiter.settle(first, [tpm(1000, 800)], tokens=100, spends=[])
    decision = await limiter.admit(member(), [tpm(1000, 300)])
    assert decision.admitted and decision.states[0].used == 400


async def test_request_larger_than_the_limit_is_refused_without_retry_hint(make_limiter):
    decision = await make_limiter().admit(member(), [tpm(100, 101)])
    assert not decision.admitted and decision.failed.retry_s < 0


async def test_all_or_nothing_across_buckets(make_limiter):
    limiter = make_limiter()
    key, tenant = rpm(10, "k:1:rpm"), rpm(1, "t:rpm")
    assert (await limiter.admit(member(), [key, tenant])).admitted
    refused = await limiter.admit(member(), [key, tenant])
    assert not refused.admitted and refused.failed.bucket.name == "t:rpm"
    assert refused.states[0].used == 1  # the key bucket was not charged for the refused request


async def test_concurrency_leases_are_released_at_settlement(make_limiter):
    limiter = make_limiter()
    slots = Bucket("concurrency", "k:1:inflight", "acme", 2, 1, "key 1")
    a, b = member(), member()
    assert (await limiter.admit(a, [slots])).admitted
    assert (await limiter.admit(b, [slots])).admitted
    assert not (await limiter.admit(member(), [slots])).admitted
    await limiter.settle(a, [slots], tokens=0, spends=[])
    assert (await limiter.admit(member(), [slots])).admitted


async def test_concurrency_lease_expires_if_never_settled(make_limiter):
    limiter = make_limiter(lease_s=1)
    slots = Bucket("concurrency", "k:1:inflight", "acme", 1, 1, "key 1")
    assert (await limiter.admit(member(), [slots])).admitted
    assert not (await limiter.admit(member(), [slots])).admitted
    await asyncio.sleep(1.05)
    assert (await limiter.admit(member(), [slots])).admitted


async def test_budget_blocks_once_spend_reaches_limit_and_seed_keeps_newer_counter(make_limiter):
    limiter = make_limiter()
    budget = Bucket("budget", "t:usd:d:2026-01-01", "acme", 1.0, 0, "tenant acme", retry_hint_s=3600)
    await limiter.seed_spend([Spend("t:usd:d:2026-01-01", "acme", 0.75, 3600)])
    await limiter.seed_spend([Spend("t:usd:d:2026-01-01", "acme", 0.10, 3600)])  # exists: ignored
    first = member()
    decision = await limiter.admit(first, [budget])
    assert decision.admitted and decision.states[0].used == pytest.approx(0.75)
    await limiter.settle(first, [budget], 0, [Spend("t:usd:d:2026-01-01", "acme", 0.25, 3600)])
    refused = await limiter.admit(member(), [budget])
    assert not refused.admitted and refused.failed.retry_s == 3600


async def test_concurrent_admissions_never_exceed_the_limit(make_limiter):
    limiter = make_limiter()
    decisions = await asyncio.gather(
        *(limiter.admit(member(), [rpm(50), tpm(10_000, 150)]) for _ in range(300))
    )
    admitted = sum(d.admitted for d in decisions)
    assert admitted == 50
