"""Scoped admin tokens: made through the admin API, stored hashed, shown once, revocable, never logged; a
`read` token may look and gets 403 insufficient_scope on any change, in the admin API and through the console
alike; the configured admin token keeps every right."""

import hashlib
import logging
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import select

from gateway.app import create_app
from policies.tables import AdminTokenRow
from tests.conftest import gateway_settings
from tests.fakes import FakeUpstream, ServerThread
from tests.policies_support import ADMIN_TOKEN, admin_client, database_fixture, make_settings, start  # noqa: F401
from tests.test_admin_api import assert_openai_error

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
CHANGES = [
    ("POST", "/admin/v1/tenants", {"name": "x"}),
    ("PATCH", "/admin/v1/tenants/acme", {"name": "y"}),
    ("DELETE", "/admin/v1/tenants/acme", None),
    ("POST", "/admin/v1/policies", {"name": "p"}),
    ("PUT", "/admin/v1/models/m", {"name": "m", "deployments": []}),
    ("POST", "/admin/v1/keys", {"tenant_id": "acme"}),
    ("POST", "/admin/v1/cache/flush", {}),
    ("POST", "/admin/v1/admin-tokens", {"scope": "admin"}),  # a read token cannot make itself a stronger one
]


@pytest.fixture
async def admin(database):
    async with admin_client(make_settings(database)) as (client, services):
        yield client, services


async def _token(client: httpx.AsyncClient, scope: str, name: str = "ops") -> dict:
    made = await client.post("/admin/v1/admin-tokens", headers=AUTH, json={"name": name, "scope": scope})
    assert made.status_code == 201, made.text
    return made.json()


async def test_a_read_token_reads_and_every_change_is_refused(admin, caplog):
    client, services = admin
    caplog.set_level(logging.DEBUG)
    assert (
        await client.post("/admin/v1/tenants", headers=AUTH, json={"id": "acme", "name": "A"})
    ).status_code == 201
    made = await _token(client, "read")
    secret = made["token"]
    assert secret.startswith("llmgw-adm-") and made["scope"] == "read" and made["prefix"] in secret
    read = {"authorization": f"Bearer {secret}"}
    for path in (
        "/admin/v1/tenants",
        "/admin/v1/keys",
        "/admin/v1/usage",
        "/admin/v1/overview",
        "/admin/v1/admin-tokens",
    ):
        assert (await client.get(path, headers=read)).status_code == 200, path
    for method, path, body in CHANGES:
        answer = await client.request(method, path, headers=read, json=body)
        assert assert_openai_error(answer, 403)["code"] == "insufficient_scope", (method, path)
    assert [t["name"] for t in (await client.get("/admin/v1/tenants", headers=AUTH)).json()] == ["A"]
    listed = (await client.get("/admin/v1/admin-tokens", headers=read)).json()
    assert [t["id"] for t in listed] == [made["id"]] and "token" not in listed[0]  # shown once only
    async with services.engine.connect() as conn:
        row = (await conn.execute(select(AdminTokenRow))).one()
    assert row.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in "".join(str(v) for v in row)  # stored hashed
    assert secret not in caplog.text  # never logged


async def test_an_admin_scoped_token_changes_and_a_revoked_one_is_refused(admin):
    client, _ = admin
    full = await _token(client, "admin", "deploy")
    bearer = {"authorization": f"Bearer {full['token']}"}
    assert (
        await client.post("/admin/v1/tenants", headers=bearer, json={"id": "t1", "name": "T"})
    ).status_code == 201
    read = await _token(client, "read")
    revoked = await client.post(f"/admin/v1/admin-tokens/{read['id']}/revoke", headers=bearer)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    gone = await client.get("/admin/v1/tenants", headers={"authorization": f"Bearer {read['token']}"})
    assert assert_openai_error(gone, 403)["code"] == "invalid_admin_token"
    assert_openai_error(await client.post("/admin/v1/admin-tokens/adm_nope/revoke", headers=AUTH), 404)
    bad = await client.post("/admin/v1/admin-tokens", headers=AUTH, json={"scope": "root"})
    assert_openai_error(bad, 422)


@pytest.fixture(scope="module")
def gateway(upstream: tuple[FakeUpstream, ServerThread]) -> Iterator[ServerThread]:
    with ServerThread(create_app(gateway_settings(upstream[1].url, admin_token=ADMIN_TOKEN))) as server:
        yield server


def _console(gateway: ServerThread, token: str) -> tuple[httpx.Client, dict]:
    client = httpx.Client(base_url=gateway.url)
    answer = client.post("/ui/api/session", json={"token": token}, headers={"origin": gateway.url})
    assert answer.status_code == 200, answer.text
    return client, answer.json()


def test_the_console_enforces_the_apis_scopes(gateway: ServerThread) -> None:
    api = httpx.Client(base_url=gateway.url, headers=AUTH)
    made = api.post("/admin/v1/admin-tokens", json={"name": "viewer", "scope": "read"}).json()
    master, session = _console(gateway, ADMIN_TOKEN)
    assert session["scope"] == "admin"
    viewer, session = _console(gateway, made["token"])
    assert session["scope"] == "read" and viewer.get("/ui/api/session").json()["scope"] == "read"
    assert made["token"] not in viewer.cookies.get("llmgw_console", "")
    assert viewer.get("/ui/api/admin/tenants").status_code == 200
    assert viewer.get("/ui/api/usage.csv", params={"group": "model"}).status_code == 200
    change = {"x-csrf-token": session["csrf"], "origin": gateway.url}
    refused = viewer.post("/ui/api/admin/tenants", json={"name": "nope"}, headers=change)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_scope"
    assert viewer.post("/ui/api/admin/cache/flush", json={}, headers=change).status_code == 403
    assert (
        master.post(
            "/ui/api/admin/tenants",
            json={"name": "ok"},
            headers={"x-csrf-token": _csrf(master), "origin": gateway.url},
        ).status_code
        == 201
    )
    assert api.post(f"/admin/v1/admin-tokens/{made['id']}/revoke").status_code == 200
    assert viewer.get("/ui/api/admin/tenants").status_code == 401  # revoking the token signs its sessions out
    wrong = httpx.post(gateway.url + "/ui/api/session", json={"token": made["token"]})
    assert wrong.status_code == 403


def _csrf(client: httpx.Client) -> str:
    return client.get("/ui/api/session").json()["csrf"]
