"""The admin REST API: token guard, CRUD with OpenAI-style errors, models, usage, cache flush."""

import httpx
import pytest
from fastapi import FastAPI

from policies.tables import utcnow
from tests.policies_support import ADMIN_TOKEN, Database, admin_client, database_fixture, make_settings, start  # noqa: F401

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
async def admin(database):
    async with admin_client(make_settings(database)) as (client, services):
        yield client, services


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


async def test_token_guard(admin):
    client, _ = admin
    assert_openai_error(await client.get("/admin/v1/tenants"), 401)
    assert_openai_error(await client.get("/admin/v1/tenants", headers={"authorization": "Bearer nope"}), 403)
    assert (await client.get("/admin/v1/tenants", headers=AUTH)).json() == []


async def test_disabled_without_a_configured_token(tmp_path):
    settings = make_settings(Database(f"sqlite+aiosqlite:///{tmp_path}/a.db", None))
    settings.admin_token = None
    services = await start(settings)
    app = FastAPI()
    app.include_router(services.admin_router)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            error = assert_openai_error(await client.get("/admin/v1/tenants", headers=AUTH), 404)
            assert "LLMGW_ADMIN_TOKEN" in error["message"]
    finally:
        await services.aclose()


async def test_tenant_key_policy_lifecycle(admin):
    client, services = admin
    policy = await client.post(
        "/admin/v1/policies",
        headers=AUTH,
        json={"name": "gold", "allowed_models": ["m"], "key_limits": {"rpm": 60, "tpm": 1000}},
    )
    assert policy.status_code == 201 and policy.json()["key_limits"]["rpm"] == 60
    policy_id = policy.json()["id"]
    tenant = await client.post(
        "/admin/v1/tenants", headers=AUTH, json={"id": "acme", "name": "Acme", "policy_id": policy_id}
    )
    assert tenant.status_code == 201
    created = await client.post("/admin/v1/keys", headers=AUTH, json={"tenant_id": "acme", "name": "ci"})
    assert created.status_code == 201
    secret, key_id = created.json()["key"], created.json()["id"]
    assert secret.startswith(created.json()["prefix"])
    listed = (await client.get("/admin/v1/keys", headers=AUTH, params={"tenant_id": "acme"})).json()
    assert [k["id"] for k in listed] == [key_id] and "key" not in listed[0] and secret not in str(listed)
    assert services.directory.policy_for(key_id).key_limits.rpm == 60  # visible to the proxy at once

    replaced = await client.put(
        f"/admin/v1/policies/{policy_id}", headers=AUTH, json={"name": "gold", "key_limits": {"rpm": 5}}
    )
    assert (
        replaced.json()["key_limits"]["rpm"] == 5
        and services.directory.policy_for(key_id).key_limits.rpm == 5
    )
    patched = await client.patch("/admin/v1/tenants/acme", headers=AUTH, json={"name": "Acme Inc"})
    assert patched.json()["name"] == "Acme Inc" and patched.json()["policy_id"] == policy_id
    assert_openai_error(await client.delete(f"/admin/v1/policies/{policy_id}", headers=AUTH), 409)

    own = (
        await client.post("/admin/v1/policies", headers=AUTH, json={"name": "own", "key_limits": {"rpm": 9}})
    ).json()
    patched_key = await client.patch(f"/admin/v1/keys/{key_id}", headers=AUTH, json={"policy_id": own["id"]})
    assert (
        patched_key.json()["policy_id"] == own["id"]
        and services.directory.policy_for(key_id).key_limits.rpm == 9
    )
    assert_openai_error(
        await client.patch(f"/admin/v1/keys/{key_id}", headers=AUTH, json={"policy_id": "pol_x"}), 404
    )
    revoked = await client.post(f"/admin/v1/keys/{key_id}/revoke", headers=AUTH)
    assert revoked.json()["revoked_at"] is not None and services.directory.policy_for(key_id) is None
    assert (await client.delete("/admin/v1/tenants/acme", headers=AUTH)).status_code == 200
    assert (await client.delete(f"/admin/v1/policies/{policy_id}", headers=AUTH)).status_code == 200


async def test_validation_and_missing_objects_are_openai_errors(admin):
    client, _ = admin
    error = assert_openai_error(
        await client.post("/admin/v1/policies", headers=AUTH, json={"name": "x", "key_limits": {"rpm": -1}}),
        422,
    )
    assert error["param"] == "key_limits.rpm"
    assert_openai_error(
        await client.post("/admin/v1/policies", headers=AUTH, json={"name": "x", "bogus": 1}), 422
    )
    for headers in (AUTH, {**AUTH, "content-type": "application/json"}):  # malformed JSON: 400 either way
        error = assert_openai_error(
            await client.post("/admin/v1/tenants", headers=headers, content=b"{no"), 400
        )
        assert error["code"] == "invalid_json"
    bad_cache = {"name": "x", "cache": {"similarity_threshold": 7}}  # validated by cache.config.CachePolicy
    error = assert_openai_error(await client.post("/admin/v1/policies", headers=AUTH, json=bad_cache), 422)
    assert error["param"] == "cache.similarity_threshold"
    assert_openai_error(
        await client.post("/admin/v1/tenants", headers=AUTH, json={"id": "bad id!", "name": "x"}), 422
    )
    assert_openai_error(  # the master key's usage is recorded under "master"
        await client.post("/admin/v1/tenants", headers=AUTH, json={"id": "master", "name": "x"}), 422
    )
    huge = {"name": "x", "key_limits": {"rpm": 10**23}, "tenant_budget": {"usd_per_day": 1e300}}
    error = assert_openai_error(await client.post("/admin/v1/policies", headers=AUTH, json=huge), 422)
    assert error["param"] in ("key_limits.rpm", "tenant_budget.usd_per_day")
    error = assert_openai_error(
        await client.post("/admin/v1/keys", headers=AUTH, json={"tenant_id": "ghost"}), 404
    )
    assert error["code"] == "tenant_not_found"
    assert_openai_error(await client.get("/admin/v1/policies/pol_nope", headers=AUTH), 404)
    await client.post("/admin/v1/tenants", headers=AUTH, json={"id": "t1", "name": "T"})
    assert_openai_error(
        await client.post("/admin/v1/tenants", headers=AUTH, json={"id": "t1", "name": "T"}), 409
    )


async def test_models_are_stored_merged_and_announced(admin):
    client, services = admin
    announced = []
    services.on_models_changed(lambda models: announced.append([m.name for m in models]))
    model = {
        "name": "big",
        "deployments": [
            {"name": "big-1", "base_url": "http://up/v1", "model": "llama", "input_price_per_1m": 3}
        ],
    }
    assert (await client.put("/admin/v1/models/big", headers=AUTH, json=model)).status_code == 200
    assert announced == [["big"]]
    assert services.directory.deployment("big-1").input_price_per_1m == 3
    listed = (await client.get("/admin/v1/models", headers=AUTH)).json()
    assert [(m["name"], m["source"]) for m in listed] == [("big", "database")]
    assert_openai_error(await client.put("/admin/v1/models/other", headers=AUTH, json=model), 400)
    broken = {"name": "big", "deployments": [{"name": "x", "backend": "openai", "model": "m"}]}  # no base_url
    assert_openai_error(await client.put("/admin/v1/models/big", headers=AUTH, json=broken), 422)
    assert (await client.delete("/admin/v1/models/big", headers=AUTH)).status_code == 200
    assert announced[-1] == []


async def test_usage_query_and_cache_flush(admin):
    client, services = admin
    for key, model in (("k1", "a"), ("k1", "b"), ("k2", "a")):
        services.usage.submit(
            {
                "ts": utcnow(),
                "request_id": "r",
                "tenant_id": "acme",
                "key_id": key,
                "model": model,
                "deployment": "d",
                "endpoint": "chat",
                "status": 200,
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "cached_tokens": 0,
                "cost_usd": 0.5,
                "latency_ms": 2.0,
                "cache_status": "miss",
            }
        )
    await services.usage.flush()
    response = await client.get(
        "/admin/v1/usage", headers=AUTH, params={"group_by": "model", "tenant_id": "acme"}
    )
    data = response.json()["data"]
    assert [(r["model"], r["requests"], r["cost_usd"]) for r in data] == [("a", 2, 1.0), ("b", 1, 0.5)]
    future = await client.get("/admin/v1/usage", headers=AUTH, params={"start": "2999-01-01T00:00:00Z"})
    assert future.json()["data"] == []
    assert_openai_error(await client.get("/admin/v1/usage", headers=AUTH, params={"group_by": "secret"}), 422)

    assert_openai_error(await client.post("/admin/v1/cache/flush", headers=AUTH, json={}), 501)
    calls = []

    async def flush(tenant_id, model):
        calls.append((tenant_id, model))
        return 7

    services.set_cache_flush(flush)
    flushed = await client.post(
        "/admin/v1/cache/flush", headers=AUTH, json={"tenant_id": "acme", "model": "a"}
    )
    assert flushed.json() == {"flushed": 7} and calls == [("acme", "a")]


async def test_openapi_documents_the_admin_api(admin):
    client, _ = admin
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert {"/admin/v1/tenants", "/admin/v1/keys", "/admin/v1/policies", "/admin/v1/usage"} <= set(paths)
