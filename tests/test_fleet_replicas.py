"""Two gateway processes sharing one Redis and one database: every limit holds for the fleet.

1,000 concurrent requests against a 100-RPM key (and a 100-request TPM budget) → 100 admitted;
admin changes made on one replica are seen by the other within 1 s; keys never reach the logs.
"""

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import pytest

from policies.migrate import upgrade_async
from tests.fakes import free_port
from tests.policies_support import ADMIN_TOKEN, POSTGRES_URL, REDIS_URL, _postgres, redis_prefix_fixture  # noqa: F401

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
ROOT = Path(__file__).resolve().parents[1]


def _spawn(port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "uvicorn", "tests.policies_replica:create_app", "--factory"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "info"]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _wait_ready(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "replica exited"
        try:
            httpx.get(url + "/docs", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("replica did not start")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fleet(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    prefix = f"llmgw-test:{uuid.uuid4().hex[:12]}:"
    url, schema = f"sqlite+aiosqlite:///{tmp / 'fleet.db'}", None
    if request.param == "postgresql":
        url, schema = POSTGRES_URL, f"llmgw_fleet_{uuid.uuid4().hex[:12]}"
        asyncio.run(_postgres(f"CREATE SCHEMA {schema}"))
    asyncio.run(upgrade_async(url, schema))
    env = {
        **os.environ,
        "LLMGW_DATABASE_URL": url,
        "LLMGW_REDIS_URL": REDIS_URL,
        "LLMGW_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    env |= {"LLMGW_POLICIES__REDIS_PREFIX": prefix, "LLMGW_POLICIES__AUTO_MIGRATE": "false"}
    env |= {"LLMGW_POLICIES__DB_SCHEMA": schema or ""} if schema else {}
    ports = [free_port(), free_port()]
    logs = [tmp / f"replica{i}.log" for i in range(2)]
    processes = [_spawn(port, env, log) for port, log in zip(ports, logs, strict=True)]
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url_, process in zip(urls, processes, strict=True):
            _wait_ready(url_, process)
        yield {"urls": urls, "logs": logs, "database": tmp / "fleet.db", "secrets": []}
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match=prefix + "*", count=1000):
            client.delete(key)
        if schema:
            asyncio.run(_postgres(f"DROP SCHEMA {schema} CASCADE"))


async def _provision(client: httpx.AsyncClient, url: str, policy: dict, fleet: dict) -> tuple[str, str]:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    created = await client.post(url + "/admin/v1/policies", headers=AUTH, json={"name": tenant, **policy})
    await client.post(
        url + "/admin/v1/tenants",
        headers=AUTH,
        json={"id": tenant, "name": tenant, "policy_id": created.json()["id"]},
    )
    key = (await client.post(url + "/admin/v1/keys", headers=AUTH, json={"tenant_id": tenant})).json()
    fleet["secrets"].append(key["key"])
    return key["key"], created.json()["id"]


def _chat(secret: str, model: str = "m") -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 86}
    return {"json": body, "headers": {"authorization": f"Bearer {secret}"}}


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: dict


async def _blast(urls: list[str], secret: str, n: int) -> list[Answer]:
    """n concurrent requests alternating between the replicas (aiohttp: a lighter client than httpx)."""
    request = _chat(secret)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=400)) as session:

        async def one(url: str) -> Answer:
            async with session.post(url + "/v1/chat/completions", **request) as response:
                headers = {k.lower(): v for k, v in response.headers.items()}
                return Answer(response.status, headers, await response.json())

        return await asyncio.gather(*(one(urls[i % 2]) for i in range(n)))


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=200))


async def _wait_for(check, timeout_s: float = 1.0) -> float:
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < timeout_s, f"not seen within {timeout_s}s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_rpm_is_exact_across_two_replicas(fleet):
    async with _client() as client:
        secret, _ = await _provision(
            client, fleet["urls"][0], {"allowed_models": ["m"], "key_limits": {"rpm": 100}}, fleet
        )
        await _wait_for(lambda: _works(client, fleet["urls"][1], secret, consume=False))
    responses = await _blast(fleet["urls"], secret, 1000)
    statuses = Counter(r.status for r in responses)
    assert statuses == {200: 100, 429: 900}
    refused = next(r for r in responses if r.status == 429)
    assert refused.body["error"]["code"] == "rate_limit_exceeded" and int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == "100"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


async def test_tpm_is_exact_across_two_replicas(fleet):
    async with _client() as client:  # each request reserves and uses 10 + 4 + 86 = 100 tokens
        secret, _ = await _provision(
            client, fleet["urls"][0], {"allowed_models": ["m"], "tenant_limits": {"tpm": 10_000}}, fleet
        )
        await _wait_for(lambda: _works(client, fleet["urls"][1], secret, consume=False))
    responses = await _blast(fleet["urls"], secret, 1000)
    assert Counter(r.status for r in responses) == {200: 100, 429: 900}
    refused = next(r for r in responses if r.status == 429)
    assert (
        refused.body["error"]["type"] == "tokens" and refused.headers["x-ratelimit-limit-tokens"] == "10000"
    )


async def _works(
    client: httpx.AsyncClient, url: str, secret: str, model: str = "m", consume: bool = True
) -> bool:
    if not consume:  # the key is known (404 for an unlisted model, not 401) and no limit is charged
        response = await client.post(url + "/v1/chat/completions", **_chat(secret, "not-a-model"))
        return response.status_code == 404
    return (await client.post(url + "/v1/chat/completions", **_chat(secret, model))).status_code == 200


async def test_policy_change_and_revocation_reach_the_other_replica_within_1s(fleet):
    first, second = fleet["urls"]
    async with _client() as client:
        secret, policy_id = await _provision(client, first, {"allowed_models": ["m"]}, fleet)
        await _wait_for(lambda: _works(client, second, secret))
        await client.put(
            f"{first}/admin/v1/policies/{policy_id}",
            headers=AUTH,
            json={"name": "x", "allowed_models": ["other"]},
        )
        seen = await _wait_for(lambda: _refused(client, second, secret, 404))
        key_id = (await client.get(first + "/admin/v1/keys", headers=AUTH)).json()[-1]["id"]
        await client.post(f"{first}/admin/v1/keys/{key_id}/revoke", headers=AUTH)
        for url in (first, second):
            await _wait_for(lambda url=url: _refused(client, url, secret, 401))
    assert seen < 1.0


async def _refused(client: httpx.AsyncClient, url: str, secret: str, status: int) -> bool:
    response = await client.post(url + "/v1/chat/completions", **_chat(secret, "other"))
    return response.status_code == status


async def test_admin_api_refuses_without_its_token_on_every_replica(fleet):
    async with _client() as client:
        for url in fleet["urls"]:
            assert (await client.get(url + "/admin/v1/tenants")).status_code == 401
            assert (
                await client.get(url + "/admin/v1/tenants", headers={"authorization": "Bearer x"})
            ).status_code == 403


def test_keys_never_reach_logs_or_the_database_in_clear(fleet):
    assert fleet["secrets"], "run with the other fleet tests"
    logs = b"".join(path.read_bytes() for path in fleet["logs"])
    assert b"/v1/chat/completions" in logs  # the access log is there
    database = fleet["database"].read_bytes() if fleet["database"].exists() else b""
    for secret in fleet["secrets"]:
        assert secret.encode() not in logs and secret.encode() not in database
