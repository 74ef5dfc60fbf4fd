"""The console's server side without a browser: off without an admin token, the session cookie, CSRF and
same-origin checks, CSP, expiry, sign-out, the static files, CSV export, and the overview's figures."""

import asyncio
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from gateway.app import create_app
from gateway.ui.session import COOKIE, Sessions
from policies.console_query import overview, series
from policies.db import create_engine
from policies.tables import Base, UsageRow
from tests.conftest import gateway_settings
from tests.fakes import FakeUpstream, ServerThread

TOKEN = "adm-unit-token"


@pytest.fixture(scope="module")
def gateway(upstream: tuple[FakeUpstream, ServerThread]) -> Iterator[ServerThread]:
    settings = gateway_settings(upstream[1].url, admin_token=TOKEN)
    with ServerThread(create_app(settings)) as server:
        yield server


def signed_in(gateway: ServerThread) -> tuple[httpx.Client, str]:
    client = httpx.Client(base_url=gateway.url)
    answer = client.post("/ui/api/session", json={"token": TOKEN}, headers={"origin": gateway.url})
    assert answer.status_code == 200
    return client, answer.json()["csrf"]


def test_the_console_is_off_without_an_admin_token(upstream: tuple[FakeUpstream, ServerThread]) -> None:
    with ServerThread(create_app(gateway_settings(upstream[1].url))) as server:
        for path in ("/ui/", "/ui/static/js/app.js", "/ui/api/session"):
            assert httpx.get(server.url + path).status_code == 404


def test_sign_in_sets_a_strict_httponly_expiring_cookie(gateway: ServerThread) -> None:
    client = httpx.Client(base_url=gateway.url)
    refused = client.post("/ui/api/session", json={"token": "wrong"})
    assert refused.status_code == 403 and "set-cookie" not in refused.headers
    answer = client.post("/ui/api/session", json={"token": TOKEN})
    cookie = answer.headers["set-cookie"]
    assert (
        "HttpOnly" in cookie
        and "SameSite=strict" in cookie
        and "Max-Age=28800" in cookie
        and "Path=/ui" in cookie
    )
    assert TOKEN not in cookie and TOKEN not in answer.text
    assert client.get("/ui/api/session").json()["signed_in"] is True
    assert client.get("/ui/api/admin/tenants").status_code == 200


def test_changes_need_the_csrf_token_and_this_origin(gateway: ServerThread) -> None:
    client, csrf = signed_in(gateway)
    body = {"name": "csrf-probe"}
    assert client.post("/ui/api/admin/tenants", json=body).status_code == 403  # no CSRF header
    assert (
        client.post("/ui/api/admin/tenants", json=body, headers={"x-csrf-token": "x" * 64}).status_code == 403
    )
    evil = {"x-csrf-token": csrf, "origin": "http://evil.example"}
    assert client.post("/ui/api/admin/tenants", json=body, headers=evil).status_code == 403
    cross = {"x-csrf-token": csrf, "sec-fetch-site": "cross-site"}
    assert client.post("/ui/api/admin/tenants", json=body, headers=cross).status_code == 403
    assert (
        httpx.post(
            gateway.url + "/ui/api/session", json={"token": TOKEN}, headers={"origin": "http://evil.example"}
        ).status_code
        == 403
    )
    ok = {"x-csrf-token": csrf, "origin": gateway.url}
    assert client.post("/ui/api/admin/tenants", json=body, headers=ok).status_code == 201
    assert httpx.get(gateway.url + "/ui/api/admin/tenants").status_code == 401  # no cookie


def test_every_console_response_carries_a_strict_csp(gateway: ServerThread) -> None:
    client, _ = signed_in(gateway)
    for path in (
        "/ui/",
        "/ui/static/js/app.js",
        "/ui/static/app.css",
        "/ui/api/session",
        "/ui/api/runtime",
        "/ui/api/admin/overview",
    ):
        answer = client.get(path)
        assert answer.status_code == 200, path
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp
        assert answer.headers["x-content-type-options"] == "nosniff"
    page = client.get("/ui/").text
    assert "<script>" not in page and "style=" not in page and "onclick" not in page  # nothing inline


def test_static_files_stay_inside_the_package(gateway: ServerThread) -> None:
    for path in (
        "/ui/static/../routes.py",
        "/ui/static/%2e%2e/routes.py",
        "/ui/static/nope.js",
        "/ui/static/js",
    ):
        assert httpx.get(gateway.url + path).status_code == 404, path


def test_sign_out_revokes_the_session(gateway: ServerThread) -> None:
    client, csrf = signed_in(gateway)
    value = client.cookies[COOKIE]
    assert client.delete("/ui/api/session", headers={"x-csrf-token": csrf}).status_code == 200
    replay = httpx.get(gateway.url + "/ui/api/admin/tenants", cookies={COOKIE: value})
    assert replay.status_code == 401


def test_sessions_expire_and_forgeries_fail() -> None:
    now = [1000.0]
    sessions = Sessions(SecretStr("t"), ttl_s=60, clock=lambda: now[0])
    value, session = sessions.issue()
    assert sessions.check(value) == session
    assert sessions.check(value.replace(value[-4:], "0000")) is None
    assert (
        Sessions(SecretStr("other"), 60, clock=lambda: now[0]).check(value) is None
    )  # new token: signed out
    now[0] += 61
    assert sessions.check(value) is None


def test_csv_export_neutralises_formulas(gateway: ServerThread) -> None:
    client, _ = signed_in(gateway)
    answer = client.get("/ui/api/usage.csv", params={"group": "tenant_id", "bucket": "day"})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
    assert answer.text.splitlines()[0] == "time,group,requests,tokens,cost_usd"
    from gateway.ui.routes import _cell

    assert _cell("=cmd()") == "'=cmd()" and _cell("acme") == "acme"


def test_policy_validation_is_the_apis(gateway: ServerThread) -> None:
    client, csrf = signed_in(gateway)
    bad = {"name": "p", "key_limits": {"rpm": -1}, "cache": {"semantic": {"mode": "sometimes"}}}
    verdict = client.post("/ui/api/validate/policy", json=bad, headers={"x-csrf-token": csrf}).json()
    assert not verdict["valid"]
    assert {p["field"] for p in verdict["problems"]} >= {"key_limits.rpm"}
    api = httpx.post(
        gateway.url + "/admin/v1/policies", json=bad, headers={"authorization": f"Bearer {TOKEN}"}
    )
    assert api.status_code == 422  # the API refuses the same body


async def _seed(url: str) -> None:
    engine = create_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.drop_all)
        await conn.run_sync(Base.metadata.create_all)
    base = datetime(2026, 1, 1)
    rows = [
        {"ts": base + timedelta(minutes=7 * i), "request_id": f"r{i}", "tenant_id": f"t{i % 3}", "key_id": f"k{i % 5}",
         "model": "m1" if i % 4 else "m2", "deployment": "d", "endpoint": "chat", "status": 500 if i % 10 == 0 else 200,
         "prompt_tokens": i, "completion_tokens": 2 * i, "cost_usd": i / 1000, "latency_ms": float((i * 37) % 101),
         "cache_status": ["miss", "hit", "semantic-hit", "bypass"][i % 4]}
        for i in range(1, 400)
    ]  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(UsageRow.__table__.insert(), rows)
    await engine.dispose()


async def _figures(url: str) -> tuple[dict, list]:
    engine = create_engine(url)
    start, end = datetime(2026, 1, 1, 2), datetime(2026, 1, 2, 12)
    try:
        return (
            await overview(engine, start, end, {"m1": (1e-6, 2e-6)}),
            await series(engine, "tenant_id", "hour", start, end, {}),
        )
    finally:
        await engine.dispose()


def test_sqlite_and_postgresql_give_the_same_overview(tmp_path: object) -> None:
    """Nearest-rank percentiles: PostgreSQL's percentile_disc and SQLite's ordered OFFSET agree."""
    sqlite = f"sqlite+aiosqlite:///{tmp_path}/console.db"
    asyncio.run(_seed(sqlite))
    lite = asyncio.run(_figures(sqlite))
    assert lite[0]["totals"]["requests"] == sum(m["requests"] for m in lite[0]["models"]) > 0
    assert lite[0]["totals"]["cache_saved_usd"] > 0
    try:
        pg = asyncio.run(_own_database("llmgw_console_test"))
    except Exception as error:  # no PostgreSQL here
        pytest.skip(f"PostgreSQL at 127.0.0.1:5432 (database test) is not reachable: {error}")
    asyncio.run(_seed(pg))
    assert _rounded(asyncio.run(_figures(pg))) == _rounded(lite)


async def _own_database(name: str) -> str:
    import asyncpg

    conn = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test", timeout=5)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"


def _rounded(value: Any) -> Any:
    """Sums of floats differ in their last bits between databases (summation order)."""
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value
