"""The rate limiter on Redis as operators run it: TLS with an ACL user, a 3-node Redis Cluster, a master
found through a Sentinel; each server started here on free loopback ports. Limits must hold exactly with
two limiters (two replicas) sharing the Redis, and Redis refusing the gateway is an error at start."""

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.app import GatewayApp
from policies.config import PoliciesSettings, RedisOptions
from policies.ratelimit.buckets import Bucket, Limiter, Spend
from policies.ratelimit.cluster import ClusterPool, key_slot
from policies.ratelimit.connect import RedisRefused
from policies.ratelimit.factory import build_limiter
from policies.ratelimit.failover import FailoverLimiter
from policies.ratelimit.redis_limiter import RedisLimiter
from tests.redis_deploy_servers import (
    ACL_PASSWORD,
    ACL_USER,
    Certificates,
    Server,
    make_certificates,
    redis_cluster,
    sentinel_redis,
    tls_acl_redis,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("redis-deploy")


@pytest.fixture(scope="module")
def certs(workdir: Path) -> Certificates:
    return make_certificates(workdir)


@pytest.fixture(scope="module")
def tls_server(workdir: Path, certs: Certificates) -> Iterator[Server]:
    with tls_acl_redis(workdir, certs) as server:
        yield server


@pytest.fixture(scope="module")
def cluster(workdir: Path) -> Iterator[list[Server]]:
    with redis_cluster(workdir) as servers:
        yield servers


def settings(**redis: object) -> PoliciesSettings:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    return PoliciesSettings(redis_prefix=prefix, replicas=1, redis_timeout_s=2.0, redis=RedisOptions(**redis))


def tls_url(server: Server, user: str = ACL_USER, password: str = ACL_PASSWORD) -> str:
    return f"rediss://{user}:{password}@127.0.0.1:{server.port}/0"


def rpm(tenant: str, limit: int) -> Bucket:
    return Bucket("requests", f"k:{tenant}:rpm", tenant, limit, 1, f"tenant {tenant}")


def tpm(tenant: str, limit: int, cost: int) -> Bucket:
    return Bucket("tokens", f"k:{tenant}:tpm", tenant, limit, cost, f"tenant {tenant}")


async def admitted(limiters: list[Limiter], buckets: list[Bucket], attempts: int) -> int:
    """`attempts` admissions spread over the limiters, all at once; how many were admitted."""
    calls = [limiters[i % len(limiters)].admit(uuid.uuid4().hex, buckets) for i in range(attempts)]
    return sum(d.admitted for d in await asyncio.gather(*calls))


async def two_limiters(config: PoliciesSettings, url: str) -> list[Limiter]:
    return [await build_limiter(config, url), await build_limiter(config, url)]


async def close(limiters: list[Limiter]) -> None:
    for limiter in limiters:
        await limiter.aclose()


async def test_tls_with_an_acl_user_holds_rpm_and_tpm_exactly_across_two_limiters(tls_server, certs):
    config = settings(tls_ca_file=certs.ca)
    limiters = await two_limiters(config, tls_url(tls_server))
    try:
        assert await admitted(limiters, [rpm("acme", 10)], 30) == 10
        assert await admitted(limiters, [tpm("globex", 1000, 100)], 30) == 10
        for limiter in limiters:
            assert isinstance(limiter, FailoverLimiter)
            report = limiter.readiness()
            assert report["ready"] and report["redis"] == "ok" and report["connected"]
    finally:
        await close(limiters)
    with tls_server.client() as client:  # the keys are in this Redis, under the limiter's prefix
        assert client.keys(config.redis_prefix + "rl:{acme}*")


async def test_tls_with_client_certificates(workdir, certs):
    config = settings(tls_ca_file=certs.ca, tls_cert_file=certs.client_cert, tls_key_file=certs.client_key)
    with tls_acl_redis(workdir, certs, client_certs=True) as server:
        limiters = await two_limiters(config, tls_url(server))
        try:
            assert await admitted(limiters, [rpm("acme", 7)], 20) == 7
        finally:
            await close(limiters)
        with pytest.raises(RedisRefused, match="TLS"):  # no client certificate: the handshake fails
            await build_limiter(settings(tls_ca_file=certs.ca), tls_url(server))


@pytest.mark.parametrize(
    "user, password, match",
    [
        (ACL_USER, "wrong", "AuthenticationError"),
        ("", ACL_PASSWORD, "AuthenticationError"),
        ("norights", ACL_PASSWORD, "NoPermissionError"),
    ],  # fmt: skip
)
async def test_redis_refusing_the_gateway_is_an_error_at_start(tls_server, certs, user, password, match):
    """A wrong password, the password without the ACL user (the old client's AUTH), an ACL without rights."""
    with pytest.raises(RedisRefused, match=match) as raised:
        await build_limiter(settings(tls_ca_file=certs.ca), tls_url(tls_server, user, password))
    assert password not in str(raised.value)


async def test_certificates_are_verified_by_default(tls_server, certs):
    with pytest.raises(RedisRefused, match="TLS failed"):  # the test CA is not among the system's
        await build_limiter(settings(), tls_url(tls_server))
    limiter = await build_limiter(settings(tls_verify=False), tls_url(tls_server))
    try:
        assert await admitted([limiter], [rpm("acme", 3)], 5) == 3
    finally:
        await limiter.aclose()


async def test_readiness_turns_to_refused_when_credentials_are_revoked(workdir, certs):
    with tls_acl_redis(workdir, certs) as server:
        limiter = await build_limiter(settings(tls_ca_file=certs.ca), tls_url(server))
        assert isinstance(limiter, FailoverLimiter)
        try:
            assert limiter.readiness()["redis"] == "ok"
            with server.client() as client:
                client.execute_command("ACL", "SETUSER", ACL_USER, "resetpass", ">another")
                client.execute_command("CLIENT", "KILL", "USER", ACL_USER)
            await limiter.admit(uuid.uuid4().hex, [rpm("acme", 5)])  # fails over to the local limiter
            for _ in range(50):
                report = limiter.readiness()
                if report["redis"] == "refused":
                    break
                await asyncio.sleep(0.05)
            assert report["redis"] == "refused" and not report["ready"]
            assert "another" not in str(report) and ACL_PASSWORD not in str(report)
        finally:
            await limiter.aclose()


async def test_cluster_holds_limits_exactly_for_tenants_on_every_node(cluster):
    config = settings(cluster=True)
    url = f"redis://127.0.0.1:{cluster[0].port}"
    limiters = await two_limiters(config, url)
    tenants = [f"tenant-{i}" for i in range(12)]
    try:
        pools = [getattr(limiter, "_primary")._pool for limiter in limiters]  # noqa: B009
        assert all(isinstance(p, ClusterPool) and len(set(p._slots)) == 3 for p in pools)
        counts = await asyncio.gather(
            *(admitted(limiters, [rpm(t, 4), tpm(t, 500, 100)], 12) for t in tenants)
        )
        assert counts == [4] * len(tenants)
        nodes_used = set()
        for server in cluster:
            with server.client() as client:
                if client.execute_command("DBSIZE"):
                    nodes_used.add(server.port)
        assert len(nodes_used) == 3  # the tenants' keys are spread over all three masters
    finally:
        await close(limiters)


async def test_every_key_of_one_call_is_in_one_slot():
    limiter = RedisLimiter(ClusterPool([("127.0.0.1", 1)], lambda h, p: None), "llmgw:rl:", 60, 30)  # type: ignore[arg-type, return-value]
    buckets = [rpm("acme", 5), tpm("acme", 500, 50), Bucket("concurrency", "t:inflight", "acme", 3, 1),
               Bucket("budget", "t:usd:d:2026-01-01", "acme", 10.0, 0.1)]  # fmt: skip
    keys, _ = limiter.admission_call("m", buckets)
    assert len(keys) == 7 and len({key_slot(k) for k in keys}) == 1
    spends = [Spend("k:x:usd:d:2026-01-01", "acme", 0.1, 60)]
    settled, _ = limiter.settlement_call("m", buckets, 100, spends)
    assert {key_slot(k) for k in settled} == {key_slot(keys[0])}
    other, _ = limiter.admission_call("m", [rpm("globex", 5)])
    assert key_slot(other[0]) != key_slot(keys[0])


async def test_cluster_follows_moved_replies(cluster):
    """A stale slot map (every slot on one node): MOVED sends each call on to the right node."""
    limiter = await build_limiter(settings(cluster=True), f"redis://127.0.0.1:{cluster[1].port}")
    try:
        pool = getattr(limiter, "_primary")._pool  # noqa: B009
        first = next(iter(pool._nodes))
        pool._slots = [first] * len(pool._slots)
        counts = [await admitted([limiter], [rpm(f"moved-{i}", 3)], 5) for i in range(6)]
        assert counts == [3] * 6
    finally:
        await limiter.aclose()


async def test_cluster_setting_must_match_the_server(cluster, tls_server, certs):
    with pytest.raises(RedisRefused, match="CLUSTER"):
        await build_limiter(settings(cluster=True, tls_ca_file=certs.ca), tls_url(tls_server))
    with pytest.raises(RedisRefused, match="is a Redis Cluster node"):
        await build_limiter(settings(), f"redis://127.0.0.1:{cluster[0].port}")


async def test_sentinel_finds_the_master_and_follows_a_failover(workdir):
    with sentinel_redis(workdir) as (master, replica, sentinel):
        config = settings(sentinel_master="mymaster")
        url = f"redis://127.0.0.1:{sentinel.port}/0"
        limiters = await two_limiters(config, url)
        try:
            assert await admitted(limiters, [rpm("acme", 6)], 15) == 6
            with sentinel.client() as client:
                client.execute_command("SENTINEL", "FAILOVER", "mymaster")
            new_master = f"127.0.0.1:{replica.port}"
            for _ in range(200):  # the replica becomes the master; the limiters reconnect to it
                await asyncio.sleep(0.05)
                for limiter in limiters:  # traffic lets the breaker's probe find Redis again
                    await limiter.admit(uuid.uuid4().hex, [rpm("probe", 10**6)])
                reports = [limiter.readiness() for limiter in limiters]
                if all(r["redis"] == "ok" and r["where"] == new_master for r in reports):
                    break
            with replica.client() as client:
                promoted = client.execute_command("ROLE")[0] == b"master"
            assert promoted, reports
            assert all(r["redis"] == "ok" and r["where"] == new_master for r in reports)
            assert await admitted(limiters, [rpm("after", 5)], 12) == 5
        finally:
            await close(limiters)


def gateway_over(server: Server, certs: Certificates, password: str = ACL_PASSWORD) -> GatewayApp:
    from gateway.app import create_app
    from tests.conftest import gateway_settings

    policies = {"redis": {"tls_ca_file": str(certs.ca)}, "replicas": 1}
    settings = gateway_settings("http://127.0.0.1:9", redis_url=tls_url(server, password=password),
                                policies=policies, cache={"semantic_enabled": False, "store": "memory"})  # fmt: skip
    return create_app(settings)


def test_health_ready_reports_the_limiters_redis(tls_server, certs):
    import httpx

    from tests.fakes import ServerThread

    with ServerThread(gateway_over(tls_server, certs)) as gateway:
        ready = httpx.get(gateway.url + "/health/ready", timeout=10).json()
    limiter = ready["rate_limiter"]
    assert (
        limiter["redis"] == "ok" and limiter["ready"] and limiter["where"] == f"127.0.0.1:{tls_server.port}"
    )
    assert ACL_PASSWORD not in str(ready)


@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnhandledThreadExceptionWarning"
)  # uvicorn exits its thread
def test_the_gateway_does_not_start_when_redis_refuses_it(tls_server, certs):
    from tests.fakes import ServerThread

    app = gateway_over(tls_server, certs, password="not-the-password")
    with pytest.raises(RuntimeError, match="did not start"), ServerThread(app):
        pass
    assert app.startup_problem is not None and "AuthenticationError" in app.startup_problem
    assert "not-the-password" not in app.startup_problem
