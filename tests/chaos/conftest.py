"""Fixtures of the chaos suite: one PostgreSQL cluster and fake upstreams per run of the suite, a fleet of two
gateway replicas sharing a Redis of their own, and helpers to provision keys and count usage rows."""

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from policies.policy import Policy
from tests.chaos.database import Key, new_schema, provision
from tests.chaos.processes import Gateway, PostgresCluster, Upstream, chaos_redis, deployment, gateway_env
from tests.redis_servers import RedisServer


@dataclass
class Fleet:
    """Two replicas (and a spare one to kill), one Redis, one database schema; `keys` by the case that uses them."""

    replicas: list[Gateway]
    spare: Gateway
    redis: RedisServer
    schema: str
    keys: dict[str, Key] = field(default_factory=dict)

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]


@pytest.fixture(scope="package")  # torn down after the last chaos case, not at the end of the whole run
def postgres() -> Iterator[PostgresCluster]:
    reason = PostgresCluster.available()
    if reason:
        pytest.skip(reason)
    cluster = PostgresCluster().init()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="package")  # torn down after the last chaos case, not at the end of the whole run
def upstreams() -> Iterator[dict[str, Upstream]]:
    """Two healthy fake upstreams and one that takes 3 s to answer anything."""
    fakes = {"a": Upstream(), "b": Upstream(), "slow": Upstream(delay_s=3.0)}
    try:
        for fake in fakes.values():
            fake.start()
        yield fakes
    finally:
        for fake in fakes.values():
            fake.stop()


def models(upstreams: dict[str, Upstream]) -> list[dict]:
    """ "m": two healthy deployments; "slow": a deployment slower than its read timeout, falling back to "m";
    "slow-only": the same without a fallback."""
    slow = deployment("slow-1", upstreams["slow"], read_timeout_s=1.0)
    return [
        {
            "name": "m",
            "deployments": [deployment("fake-a", upstreams["a"]), deployment("fake-b", upstreams["b"])],
        },
        {"name": "slow", "deployments": [slow], "fallbacks": ["m"]},
        {"name": "slow-only", "deployments": [{**slow, "name": "slow-2"}]},
    ]


FLEET_KEYS = {
    "database": Policy(),
    "redis-kill": Policy(key_limits={"rpm": 1_000_000}),
    "redis-pause": Policy(key_limits={"rpm": 1_000_000}),
    "exact": Policy(key_limits={"rpm": 100}),
    "exact-after-restart": Policy(key_limits={"rpm": 100}),
    "backend": Policy(),
    "concurrency": Policy(key_limits={"max_concurrent": 2}),
}
LEASE_S = 6  # concurrency slots of a killed replica free after this long


@pytest.fixture(scope="package")  # torn down after the last chaos case, not at the end of the whole run
def fleet(postgres: PostgresCluster, upstreams: dict[str, Upstream], tmp_path_factory) -> Iterator[Fleet]:
    redis = chaos_redis()
    schema = new_schema(postgres)
    keys = asyncio.run(provision(postgres.url, schema, FLEET_KEYS))
    env = gateway_env(postgres.url, schema, models(upstreams), redis.url,
                      LLMGW_POLICIES__CONCURRENCY_LEASE_S=str(LEASE_S),
                      LLMGW_POLICIES__REDIS_TIMEOUT_S="0.25")  # fmt: skip
    # 0.25 s, not 50 ms: on a starved 2-core CI box a 50 ms bound trips the breaker with Redis healthy, and
    # the fail-open share then over-admits (seen: 111 of a 100-RPM limit at load 12)
    log_dir = tmp_path_factory.mktemp("fleet")
    replicas = [Gateway(env, log_dir=log_dir).spawn() for _ in range(3)]
    try:
        for replica in replicas:
            replica.wait_ready()
        yield Fleet(replicas[:2], replicas[2], redis, schema, keys)
    finally:
        for replica in replicas:
            replica.terminate()
        redis.stop()


async def metric(url: str, name: str) -> float:
    """The sum of one metric's samples on a replica's /metrics."""
    async with httpx.AsyncClient(timeout=5) as client:
        text = (await client.get(url + "/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name)] in " {")  # fmt: skip
