"""The cache and the Responses store reach a managed-style Redis (TLS with a private CA, an ACL user) the
way the rate limiter does: through LLMGW_POLICIES__REDIS__* options, not the URL alone (which verified
against the system CAs only and failed at the first cache lookup)."""

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import FakeUpstream, ServerThread
from tests.redis_deploy_servers import (
    ACL_PASSWORD,
    ACL_USER,
    Certificates,
    Server,
    make_certificates,
    tls_acl_redis,
)

pytestmark = pytest.mark.timeout(120)
AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Certificates]]:
    workdir: Path = tmp_path_factory.mktemp("tls-stores")
    certs = make_certificates(workdir)
    with tls_acl_redis(workdir, certs) as server:
        yield server, certs


def test_cache_and_responses_store_use_tls_options(tls_redis: tuple[Server, Certificates]) -> None:
    server, certs = tls_redis
    prefix = f"t{uuid.uuid4().hex[:8]}"
    with ServerThread(FakeUpstream()) as upstream:
        settings = gateway_settings(
            upstream.url, redis_url=f"rediss://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{server.port}/0",
            policies={"redis": {"tls_ca_file": str(certs.ca)}, "replicas": 1, "redis_prefix": prefix + ":"},
            cache={"semantic_enabled": False, "store": "redis", "key_prefix": prefix + ":cache"},
            responses={"store": "redis", "key_prefix": prefix + ":responses"},
        )  # fmt: skip
        with (
            ServerThread(create_app(settings)) as gateway,
            httpx.Client(base_url=gateway.url, headers=AUTH) as http,
        ):
            chat = {
                "model": "fake-model",
                "messages": [{"role": "user", "content": "tls?"}],
                "temperature": 0,
            }
            first = http.post("/v1/chat/completions", json=chat, timeout=30)
            again = http.post("/v1/chat/completions", json=chat, timeout=30)
            assert first.status_code == again.status_code == 200, first.text
            assert again.headers["x-cache-status"] == "hit"
            created = http.post("/v1/responses", json={"model": "fake-model", "input": "keep me"}, timeout=30)
            assert created.status_code == 200, created.text
            fetched = http.get(f"/v1/responses/{created.json()['id']}", timeout=30)
            assert fetched.status_code == 200 and fetched.json()["id"] == created.json()["id"]
    with server.client() as client:
        assert client.keys(f"{prefix}:cache*") and client.keys(f"{prefix}:responses*")
