"""Two gateway processes sharing one Redis and one database: every limit holds for the fleet.

1,000 concurrent requests against a 100-RPM key (and a 100-request TPM budget) → 100 admitted;
admin changes made on one replica are seen by the other within 1 s; keys never reach the logs.
"""

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import httpx
import openai
import pytest

from tests.fakes import FakeUpstream, ServerThread
from tests.policies_fleet import Fleet
from tests.policies_support import ADMIN_TOKEN

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
VARIANTS = [("policies", "sqlite"), ("policies", "postgresql"), ("gateway", "sqlite")]


@pytest.fixture(scope="module", params=VARIANTS, ids=["-".join(v) for v in VARIANTS])
def fleet(request, tmp_path_factory) -> Iterator[Fleet]:
    app, db = request.param
    fleet = Fleet(app, db, tmp_path_factory.mktemp("fleet"))
    with contextlib.ExitStack() as stack:
        if app == "gateway":
            fleet.upstream_url = stack.enter_context(ServerThread(FakeUpstream())).url
        fleet.start()
        stack.callback(fleet.stop)
        yield fleet


async def _provision(client: httpx.AsyncClient, url: str, policy: dict, fleet: Fleet) -> tuple[str, str]:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    created = await client.post(url + "/admin/v1/policies", headers=AUTH, json={"name": tenant, **policy})
    await client.post(
        url + "/admin/v1/tenants",
        headers=AUTH,
        json={"id": tenant, "name": tenant, "policy_id": created.json()["id"]},
    )
    key = (await client.post(url + "/admin/v1/keys", headers=AUTH, json={"tenant_id": tenant})).json()
    fleet.secrets.append(key["key"])
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
        await asyncio.sleep(0.05)  # polling must not saturate the replica it watches
    return time.monotonic() - started


async def test_rpm_is_exact_across_two_replicas(fleet):
    async with _client() as client:
        secret, _ = await _provision(
            client, fleet.urls[0], {"allowed_models": ["m"], "key_limits": {"rpm": 100}}, fleet
        )
        await _wait_for(lambda: _works(client, fleet.urls[1], secret, consume=False))
    responses = await _blast(fleet.urls, secret, 1000)
    statuses = Counter(r.status for r in responses)
    assert statuses == {200: 100, 429: 900}
    refused = next(r for r in responses if r.status == 429)
    assert refused.body["error"]["code"] == "rate_limit_exceeded" and int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == "100"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


async def test_tpm_is_exact_across_two_replicas(fleet):
    if fleet.app == "gateway":
        pytest.skip(
            "a real upstream's usage differs from the reservation, so settlement frees capacity mid-burst"
        )
    async with _client() as client:  # each request reserves and uses 10 + 4 + 86 = 100 tokens
        secret, _ = await _provision(
            client, fleet.urls[0], {"allowed_models": ["m"], "tenant_limits": {"tpm": 10_000}}, fleet
        )
        await _wait_for(lambda: _works(client, fleet.urls[1], secret, consume=False))
    responses = await _blast(fleet.urls, secret, 1000)
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
    first, second = fleet.urls
    async with _client() as client:
        secret, policy_id = await _provision(client, first, {"allowed_models": ["m"]}, fleet)
        await _wait_for(lambda: _works(client, second, secret))
        await client.put(
            f"{first}/admin/v1/policies/{policy_id}",
            headers=AUTH,
            json={"name": "x", "allowed_models": ["other"]},
        )
        try:
            seen = await _wait_for(lambda: _refused(client, second, secret, 404))
        except AssertionError as exc:  # say why: the replicas' own account of the change
            raise AssertionError(f"{exc}\n{fleet.log_tails()}") from None
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
        for url in fleet.urls:
            assert (await client.get(url + "/admin/v1/tenants")).status_code == 401
            assert (
                await client.get(url + "/admin/v1/tenants", headers={"authorization": "Bearer x"})
            ).status_code == 403


async def test_openai_sdk_sees_headers_and_rate_limit_errors(fleet):
    async with _client() as client:
        secret, _ = await _provision(
            client, fleet.urls[0], {"allowed_models": ["m"], "key_limits": {"rpm": 2}}, fleet
        )
        await _wait_for(lambda: _works(client, fleet.urls[1], secret, consume=False))
    sdks = [openai.AsyncOpenAI(base_url=url + "/v1", api_key=secret, max_retries=0) for url in fleet.urls]
    messages = [{"role": "user", "content": "hello"}]
    raw = await sdks[0].chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=5)
    assert raw.headers["x-ratelimit-remaining-requests"] == "1" and raw.parse().object == "chat.completion"
    await sdks[1].chat.completions.create(model="m", messages=messages, max_tokens=5)
    with pytest.raises(openai.RateLimitError) as refused:
        await sdks[0].chat.completions.create(model="m", messages=messages, max_tokens=5)
    assert (
        refused.value.code == "rate_limit_exceeded"
        and int(refused.value.response.headers["retry-after"]) >= 1
    )
    for sdk in sdks:
        await sdk.close()


def test_keys_never_reach_logs_or_the_database_in_clear(fleet):  # last: sees every key made above
    assert fleet.secrets, "run with the other fleet tests"
    logs = b"".join(path.read_bytes() for path in fleet.logs)
    assert b"/v1/chat/completions" in logs  # the access log is there
    files = [fleet.database_file, fleet.database_file.with_name("fleet.db-wal")]
    database = b"".join(path.read_bytes() for path in files if path.exists())
    for secret in fleet.secrets:
        assert secret.encode() not in logs and secret.encode() not in database
