"""Every Redis error path of the rate limiter, against real throw-away redis-server processes.

Fresh Redis (scripts not loaded), SCRIPT FLUSH, BUSY, OOM, READONLY, WRONGTYPE, a reset connection,
a paused (SIGSTOP) and a killed-and-restarted-empty Redis: no request fails with anything but the
policy's failure mode (fail-open: a local decision; fail-closed: 503), and Redis is used again at once.
"""

import asyncio
import contextlib
import threading
import time
import uuid

import pytest
import redis

from core.errors import OpenAIError
from policies.metrics import REDIS_FAILURES
from policies.ratelimit.buckets import Bucket
from policies.ratelimit.failover import FailoverLimiter
from policies.ratelimit.local_limiter import LocalLimiter
from policies.ratelimit.redis_limiter import RedisLimiter
from policies.ratelimit.resp import RespPool
from tests.redis_servers import redis_servers

PREFIX = "t:"
RETRY_S = 0.3


@pytest.fixture
def servers(tmp_path):
    with redis_servers(2, tmp_path) as started:
        yield started


@pytest.fixture
def server(servers):
    return servers[0]


def rpm(limit: int, name: str = "k:1:rpm") -> Bucket:
    return Bucket("requests", name, "acme", limit, 1, "key 1")


def tpm(limit: int, cost: int) -> Bucket:
    return Bucket("tokens", "k:1:tpm", "acme", limit, cost, "key 1")


def member() -> str:
    return uuid.uuid4().hex


class Limiters:
    """A failover limiter over a fresh pool to `url`, and the Redis limiter inside it."""

    def __init__(self, url: str, mode: str = "open", timeout_s: float = 0.05) -> None:
        self.redis = RedisLimiter(RespPool.from_url(url, timeout_s), PREFIX, 60, 30)
        self.failover = FailoverLimiter(self.redis, LocalLimiter(60, 30), mode, RETRY_S)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self.failover.aclose()


@pytest.fixture
async def limiters(server):
    made: list[Limiters] = []

    def make(url: str = server.url, mode: str = "open", timeout_s: float = 0.05) -> Limiters:
        made.append(Limiters(url, mode, timeout_s))
        return made[-1]

    yield make
    for limiter in made:
        await limiter.aclose()


def failures() -> float:
    return sum(REDIS_FAILURES.labels(operation="admit", mode=m)._value.get() for m in ("open", "closed"))


def redis_count(server, name: str = "k:1:rpm") -> int:
    with server.client() as client:
        return client.zcard(f"{PREFIX}{{acme}}:{name}")


async def test_fresh_redis_admits_and_settles_to_the_reported_tokens(server, limiters):
    limiter = limiters().redis  # nothing loaded: the scripts load with the connection
    first = member()
    assert (await limiter.admit(first, [tpm(1000, 300)])).admitted
    await limiter.settle(first, [tpm(1000, 300)], tokens=450, spends=[])  # the upstream reported 450
    decision = await limiter.admit(member(), [tpm(1000, 100)])
    assert decision.admitted and decision.states[0].used == 550


async def test_script_flush_reloads_without_failing_the_request(server, limiters):
    limiter = limiters().redis
    assert (await limiter.admit(member(), [rpm(5)])).admitted
    with server.client() as client:
        client.script_flush()
    second = member()
    decision = await limiter.admit(second, [tpm(1000, 300)])  # NOSCRIPT → EVAL, same request
    assert decision.admitted
    await limiter.settle(second, [tpm(1000, 300)], tokens=10, spends=[])
    await limiter.drain()
    with server.client() as client:
        client.script_flush()
    assert (await limiter.admit(member(), [tpm(1000, 100)])).states[0].used == 110


async def _answered_locally(limiters_: Limiters, server) -> None:
    """Fail-open: admitted by the local limiter, counted, and Redis left alone while the breaker is open."""
    before = failures()
    assert (await limiters_.failover.admit(member(), [rpm(5)])).admitted
    assert failures() == before + 1
    assert (await limiters_.failover.admit(member(), [rpm(5)])).admitted
    assert failures() == before + 1  # the breaker is open: no second try


async def _refused_closed(url: str, limiters, bucket: Bucket | None = None) -> None:
    closed = limiters(url, mode="closed")
    with pytest.raises(OpenAIError) as refused:
        await closed.failover.admit(member(), [bucket or rpm(5)])
    assert refused.value.status == 503 and refused.value.headers["retry-after"] == "1"


async def test_busy_script_fails_over_then_recovers(server, limiters):
    with server.client() as client:
        client.config_set("lua-time-limit", 10)  # BUSY replies after 10 ms of a running script
    busy = threading.Thread(target=_busy_loop, args=(server,))
    busy.start()
    try:
        await asyncio.sleep(0.3)
        await _answered_locally(limiters(), server)
        await _refused_closed(server.url, limiters)
    finally:
        _script_kill(server)
        busy.join(timeout=10)
    recovered = limiters()
    assert (await recovered.failover.admit(member(), [rpm(5)])).admitted
    assert redis_count(server) == 1


def _busy_loop(server) -> None:
    with server.client(socket_timeout=30) as client, contextlib.suppress(redis.ResponseError):
        client.eval("local i = 0 while true do i = i + 1 end", 0)  # until SCRIPT KILL


def _script_kill(server) -> None:
    deadline = time.monotonic() + 10
    with server.client() as client:
        while time.monotonic() < deadline:
            try:
                client.script_kill()
                return
            except redis.ResponseError:  # not running yet, or just ended
                return
            except redis.ConnectionError:
                time.sleep(0.05)


async def test_out_of_memory_fails_over(server, limiters):
    with server.client() as client:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
    try:
        await _answered_locally(limiters(), server)
        await _refused_closed(server.url, limiters)
    finally:
        with server.client() as client:
            client.config_set("maxmemory", 0)
    assert redis_count(server) == 0


async def test_read_only_replica_fails_over(servers, limiters):
    primary, replica = servers
    with replica.client() as client:
        client.replicaof("127.0.0.1", primary.port)
    await _answered_locally(limiters(replica.url), replica)
    await _refused_closed(replica.url, limiters)


async def test_wrong_type_fails_that_request_only(server, limiters):
    with server.client() as client:
        client.set(f"{PREFIX}{{acme}}:k:bad:rpm", "a string")
    pair = limiters()
    before = failures()
    assert (await pair.failover.admit(member(), [rpm(5, "k:bad:rpm")])).admitted  # local decision
    assert failures() == before + 1
    assert (await pair.failover.admit(member(), [rpm(5)])).admitted  # the breaker stayed closed
    assert redis_count(server) == 1
    await _refused_closed(server.url, limiters, rpm(5, "k:bad:rpm"))


async def test_connection_reset_costs_no_request(server, limiters):
    pair = limiters()
    assert (await pair.failover.admit(member(), [rpm(50)])).admitted
    with server.client() as client:
        client.client_kill_filter(_type="normal", skipme=True)
    assert (await pair.failover.admit(member(), [rpm(50)])).admitted  # Redis, or locally
    await asyncio.sleep(RETRY_S + 0.1)
    assert (await pair.failover.admit(member(), [rpm(50)])).admitted
    assert redis_count(server) >= 2


async def test_paused_redis_costs_one_timeout_then_is_exact_again_within_1s(server, limiters):
    pair = limiters()
    assert (await pair.failover.admit(member(), [rpm(10)])).admitted
    server.pause()
    try:
        started = time.monotonic()
        decisions = [await pair.failover.admit(member(), [rpm(10)]) for _ in range(20)]
        elapsed = time.monotonic() - started
    finally:
        server.resume()
    assert all(d.admitted for d in decisions[:10])  # the local limiter: a full limit (one replica)
    assert elapsed < 1.0  # one 50 ms timeout opens the breaker; a loaded machine gets slack
    await asyncio.sleep(1.0)
    after = [await pair.failover.admit(member(), [rpm(20)]) for _ in range(12)]
    # Redis decides again, its window counting the 1 before and the 10 admitted locally during the pause
    # (replayed; the timed-out call may also have run once Redis continued: same member, counted once)
    assert sum(d.admitted for d in after) == 20 - 1 - 10
    assert redis_count(server) == 20


async def test_restart_empty_is_exact_again_within_1s(server, limiters):
    pair = limiters()
    assert (await pair.failover.admit(member(), [rpm(3)])).admitted
    server.kill()
    assert (await pair.failover.admit(member(), [rpm(3)])).admitted  # refused connection: local
    server.start()
    await asyncio.sleep(1.0)
    after = [await pair.failover.admit(member(), [rpm(3)]) for _ in range(5)]
    # the empty Redis counts the one admitted locally while it was away (replayed), not the one it lost
    assert [d.admitted for d in after] == [True, True, False, False, False]
    assert redis_count(server) == 3


async def test_tokens_used_while_redis_was_away_count_once_it_returns(server, limiters):
    pair = limiters()
    server.kill()
    local = member()
    assert (await pair.failover.admit(local, [tpm(1000, 300)])).admitted  # local decision
    await pair.failover.settle(local, [tpm(1000, 300)], tokens=450, spends=[])  # the upstream's count
    server.start()
    await asyncio.sleep(1.0)
    decision = await pair.failover.admit(member(), [tpm(1000, 100)])
    assert decision.admitted and decision.states[0].used == 550  # replayed with its real tokens
