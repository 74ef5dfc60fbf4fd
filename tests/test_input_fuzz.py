"""Malformed input of every kind gets a 4xx in the API's error shape, never a 500: the proxy and the admin API.

Also: gzip/deflate request bodies (bounded when inflated), the client's x-request-id, 405 with Allow.
"""

import gzip
import zlib
from collections.abc import AsyncIterator, Iterator

import httpx
import orjson
import pytest
from fastapi import FastAPI

from gateway.app import create_app
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import FakeUpstream, ServerThread
from tests.policies_support import ADMIN_TOKEN, database_fixture, make_settings, start  # noqa: F401

AUTH = {"authorization": f"Bearer {MASTER_KEY}"}
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
LIMIT = 64 * 1024  # max_body_bytes in tests.conftest


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    fake = FakeUpstream()
    with ServerThread(fake) as upstream:
        settings = gateway_settings(upstream.url, admin_token=MASTER_KEY)
        with ServerThread(create_app(settings)) as gateway:
            yield fake, gateway


def send(gateway: ServerThread, content: bytes | Iterator[bytes], headers: dict[str, str] | None = None,
         method: str = "POST", path: str = "/v1/chat/completions") -> httpx.Response:  # fmt: skip
    return httpx.request(method, gateway.url + path, content=content, headers={**AUTH, **(headers or {})},
                         timeout=30)  # fmt: skip


def assert_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def nested(depth: int) -> bytes:
    return b'{"model": "fake-model", "messages": ' + b"[" * depth + b"]" * depth + b"}"


MALFORMED = [
    b"\x00",
    b'{"model": "fake-model\x00", "messages": []}',  # a raw NUL is not valid JSON
    b"{" * 100_00,
    nested(5000),
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}',
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e30}',
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "seed": 1e30}',
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "n": -99999999999999999999999}',
    b'{"model": "fake-model", "messages": [{"role": ["user"], "content": "hi"}]}',
    b'{"model": "fake-model", "messages": [{"role": {"a": 1}, "content": "hi"}]}',
    b'{"model": "fake-model", "messages": {"role": "user"}}',
    b'{"model": ["fake-model"], "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stop": [1, 2]}',
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream_options": []}',
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "cache": "yes"}',
    b'{"model": "fake-model", "messages": [null]}',
    b'"just a string"',
    b"\xff\xfe\xfd",
    "{\"model\": \"fake-model\", \"messages\": [{\"role\": \"user\", \"content\": \"\ud800\"}]}".encode("utf-8", "surrogatepass"),
]  # fmt: skip


@pytest.mark.parametrize("body", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_chat_bodies_are_4xx(served: tuple[FakeUpstream, ServerThread], body: bytes) -> None:
    response = send(served[1], body)
    assert 400 <= response.status_code < 500, response.text
    assert_error(response, response.status_code)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings"])
def test_wrong_types_on_other_endpoints_are_400(served: tuple[FakeUpstream, ServerThread], path: str) -> None:
    for body in ({"model": "fake-model", "prompt": {}}, {"model": "fake-model", "input": 5},
                 {"model": "fake-model", "input": [], "prompt": "x", "max_tokens": "many"}):  # fmt: skip
        assert_error(send(served[1], orjson.dumps(body), path=path), 400)


def test_nul_in_content_is_passed_on(served: tuple[FakeUpstream, ServerThread]) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "a\u0000b"}]}
    response = send(served[1], orjson.dumps(body))
    assert response.status_code == 200 and "a\u0000b" in response.json()["choices"][0]["message"]["content"]


def test_huge_body_is_413(served: tuple[FakeUpstream, ServerThread]) -> None:
    body = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * (LIMIT * 4)}]})
    assert_error(send(served[1], body), 413)


def test_huge_admin_bodies_are_refused(served: tuple[FakeUpstream, ServerThread]) -> None:
    body = orjson.dumps({"name": "x" * (LIMIT * 4)})
    assert_error(send(served[1], body, path="/admin/v1/tenants"), 413)

    def chunks() -> Iterator[bytes]:
        yield from (body[i : i + 4096] for i in range(0, len(body), 4096))

    response = send(served[1], chunks(), path="/admin/v1/tenants")  # no content-length: counted as it comes
    assert response.status_code in (400, 413)
    assert_error(response, response.status_code)


@pytest.mark.parametrize("method", ["TRACE", "PUT", "DELETE", "PATCH", "GET"])
def test_unknown_methods_are_405_with_allow(served: tuple[FakeUpstream, ServerThread], method: str) -> None:
    response = send(served[1], b"", method=method)
    assert_error(response, 405)
    assert response.headers["allow"] == "POST"
    response = send(served[1], b"", method="TRACE", path="/admin/v1/tenants")
    assert_error(response, 405)
    assert response.headers["allow"] == "GET, POST"


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("deflate", lambda b: zlib.compress(b, wbits=-15))],
)
def test_compressed_bodies_are_accepted(
    served: tuple[FakeUpstream, ServerThread], encoding: str, compress
) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": f"packed with {encoding}"}]}
    response = send(served[1], compress(orjson.dumps(body)), {"content-encoding": encoding})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == f"echo: packed with {encoding}"


def test_compressed_bodies_are_bounded_and_checked(served: tuple[FakeUpstream, ServerThread]) -> None:
    bomb = gzip.compress(b'{"model": "' + b"a" * (LIMIT * 50) + b'"}')
    assert len(bomb) < LIMIT
    assert_error(send(served[1], bomb, {"content-encoding": "gzip"}), 413)
    assert_error(send(served[1], b"not gzip at all", {"content-encoding": "gzip"}), 400)
    assert_error(send(served[1], gzip.compress(orjson.dumps(CHAT))[:-8], {"content-encoding": "gzip"}), 400)
    assert_error(send(served[1], orjson.dumps(CHAT), {"content-encoding": "br"}), 415)


def test_compressed_bodies_on_the_messages_and_admin_apis(served: tuple[FakeUpstream, ServerThread]) -> None:
    """The routes behind the framework inflate gzip/deflate and refuse other codings as the proxy does."""
    message = {"model": "fake-model", "max_tokens": 5, "messages": [{"role": "user", "content": "zipped"}]}
    answer = send(served[1], gzip.compress(orjson.dumps(message)), {"content-encoding": "gzip"},
                  path="/v1/messages")  # fmt: skip
    assert answer.status_code == 200 and answer.json()["content"][0]["text"] == "echo: zipped", answer.text
    refused = send(served[1], orjson.dumps(message), {"content-encoding": "br"}, path="/v1/messages")
    assert refused.status_code == 415 and refused.json()["error"]["type"] == "invalid_request_error"
    bomb = gzip.compress(b'{"model": "' + b"a" * (LIMIT * 50) + b'"}')
    assert send(served[1], bomb, {"content-encoding": "gzip"}, path="/v1/messages").status_code == 413
    tenant = orjson.dumps({"id": "zipped-tenant", "name": "zipped"})
    deflated = {"content-encoding": "deflate", "content-type": "application/json"}
    created = send(served[1], zlib.compress(tenant), deflated, path="/admin/v1/tenants")
    assert created.status_code == 201 and created.json()["id"] == "zipped-tenant", created.text
    assert_error(send(served[1], tenant, {"content-encoding": "br"}, path="/admin/v1/tenants"), 415)
    assert_error(send(served[1], b"not gzip", {"content-encoding": "gzip"}, path="/admin/v1/tenants"), 400)


def test_client_request_id_is_kept_returned_and_forwarded(served: tuple[FakeUpstream, ServerThread]) -> None:
    fake, gateway = served
    given = "trace-2024/abc:DEF_123"
    response = send(gateway, orjson.dumps(CHAT), {"x-request-id": given})
    assert response.status_code == 200 and response.headers["x-request-id"] == given
    assert fake.requests[-1]["headers"][b"x-request-id"] == given.encode()
    assert (
        httpx.get(gateway.url + "/health/live", headers={"x-request-id": given}).headers["x-request-id"]
        == given
    )
    for bad in ("x" * 65, "has space", ""):
        response = send(gateway, orjson.dumps(CHAT), {"x-request-id": bad})
        assert response.status_code == 200 and response.headers["x-request-id"] not in (bad, "")
        assert fake.requests[-1]["headers"][b"x-request-id"] == response.headers["x-request-id"].encode()


# The admin API, on SQLite and PostgreSQL (PostgreSQL refuses NUL in text: the 500s were there).


@pytest.fixture
async def admin(database) -> AsyncIterator[httpx.AsyncClient]:
    services = await start(make_settings(database))
    app = FastAPI()
    app.include_router(services.admin_router)
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                                 headers=headers) as client:  # fmt: skip
        yield client
    await services.aclose()


async def test_admin_rejects_nul_everywhere(admin: httpx.AsyncClient) -> None:
    assert (await admin.post("/admin/v1/tenants", json={"id": "acme", "name": "Acme"})).status_code == 201
    key = (await admin.post("/admin/v1/keys", json={"tenant_id": "acme"})).json()
    cases = [  # (method, path, JSON body or query)
        ("post", "/admin/v1/tenants", {"name": "Ac\u0000me"}),
        ("post", "/admin/v1/keys", {"tenant_id": "ac\u0000me"}),
        ("get", "/admin/v1/keys/key%00x"),
        ("patch", f"/admin/v1/keys/{key['id']}", {"name": "a\u0000"}),
        ("get", "/admin/v1/keys", {"tenant_id": "ac\u0000me"}),
        ("get", "/admin/v1/usage", {"tenant_id": "ac\u0000me"}),
        ("post", "/admin/v1/policies", {"name": "p", "model_limits": {"m\u0000": {"rpm": 1}}}),
    ]
    for method, path, *body in cases:
        kwargs = {"json": body[0]} if body and method != "get" else {"params": body[0]} if body else {}
        error = assert_error(await admin.request(method, path, **kwargs), 422)
        assert "NUL" in error["message"]


async def test_admin_dates_and_patches(admin: httpx.AsyncClient) -> None:
    for start_at in ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"):
        response = await admin.get(
            "/admin/v1/usage", params={"start": start_at, "end": "9999-12-31T00:00:00Z"}
        )
        assert response.status_code == 200 and response.json()["data"] == []
    for number in ("0.5", "1700000000", "-1e5"):
        assert_error(await admin.get("/admin/v1/usage", params={"start": number}), 422)
    assert (await admin.post("/admin/v1/tenants", json={"id": "acme", "name": "Acme"})).status_code == 201
    for expiry in ("9999-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "2200-01-01T00:00:00Z"):
        error = assert_error(
            await admin.post("/admin/v1/keys", json={"tenant_id": "acme", "expires_at": expiry}), 422
        )
        assert error["param"] == "expires_at"
    key = await admin.post("/admin/v1/keys", json={"tenant_id": "acme", "expires_at": "2030-01-01T00:00:00Z"})
    assert key.status_code == 201 and key.json()["expires_at"] == "2030-01-01T00:00:00Z"
    key_id = key.json()["id"]
    assert_error(await admin.patch(f"/admin/v1/keys/{key_id}", json={}), 422)
    assert_error(await admin.patch("/admin/v1/tenants/acme", json={}), 422)
    assert_error(
        await admin.patch(f"/admin/v1/keys/{key_id}", json={"expires_at": "9999-01-01T00:00:00Z"}), 422
    )
    assert_error(await admin.patch(f"/admin/v1/keys/{key_id}", json={"name": None}), 400)
    assert_error(await admin.patch(f"/admin/v1/keys/{key_id}", content=b"[1, 2]"), 422)
    assert (await admin.patch(f"/admin/v1/keys/{key_id}", json={"name": "renamed"})).json()[
        "name"
    ] == "renamed"


async def test_admin_malformed_bodies(admin: httpx.AsyncClient) -> None:
    for body in (b"{" * 100_000, b"[" * 5000 + b"]" * 5000, b'{"name": 1e999}', b"\x00", b'{"name": "x"'):
        response = await admin.post(
            "/admin/v1/tenants", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code in (400, 422)
        assert_error(response, response.status_code)
    response = await admin.post("/admin/v1/tenants", json={"name": ["a"], "id": {"x": 1}})
    assert_error(response, 422)
