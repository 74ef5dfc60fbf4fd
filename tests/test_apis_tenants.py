"""Stored responses and model cards are per tenant; /openapi.json documents the new routes."""

import asyncio
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from gateway.app import create_app
from policies.policy import Policy
from policies.provision import provision_virtual_key
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import FakeUpstream, ServerThread


@pytest.fixture(scope="module")
def tenants(upstream: tuple[FakeUpstream, ServerThread]) -> Iterator[tuple[ServerThread, str, str]]:
    settings = gateway_settings(upstream[1].url)
    other = asyncio.run(provision_virtual_key(settings, "other"))
    narrow = asyncio.run(provision_virtual_key(settings, "narrow", Policy(allowed_models=["something-else"])))
    with ServerThread(create_app(settings)) as server:
        yield server, other, narrow


def sdk(server: ServerThread, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def test_a_stored_response_is_invisible_to_other_tenants(tenants: tuple[ServerThread, str, str]) -> None:
    server, other, _ = tenants
    mine = sdk(server, MASTER_KEY).responses.create(model="fake-model", input="private")
    theirs = sdk(server, other)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.create(model="fake-model", input="x", previous_response_id=mine.id)
    assert sdk(server, MASTER_KEY).responses.retrieve(mine.id).output_text == "echo: private"


def test_a_clients_request_id_cannot_overwrite_a_stored_response(
    tenants: tuple[ServerThread, str, str],
) -> None:
    """Stored ids are the gateway's own: two requests with one x-request-id store two responses."""
    server, other, _ = tenants
    same = {"x-request-id": "collide-8"}
    mine = sdk(server, MASTER_KEY).responses.create(model="fake-model", input="first", extra_headers=same)
    theirs = sdk(server, other).responses.create(model="fake-model", input="second", extra_headers=same)
    again = sdk(server, MASTER_KEY).responses.create(model="fake-model", input="third", extra_headers=same)
    assert len({mine.id, theirs.id, again.id}) == 3 and "collide-8" not in mine.id
    assert sdk(server, MASTER_KEY).responses.retrieve(mine.id).output_text == "echo: first"
    assert sdk(server, other).responses.retrieve(theirs.id).output_text == "echo: second"


def test_keys_see_only_their_models(tenants: tuple[ServerThread, str, str]) -> None:
    server, other, narrow = tenants
    assert sdk(server, other).models.retrieve("fake-model").id == "fake-model"
    with pytest.raises(openai.NotFoundError):
        sdk(server, narrow).models.retrieve("fake-model")
    with pytest.raises(openai.NotFoundError):
        sdk(server, narrow).responses.create(model="fake-model", input="x")
    client = anthropic.Anthropic(base_url=server.url, api_key=narrow, max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="fake-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])


def test_openapi_documents_the_new_routes(tenants: tuple[ServerThread, str, str]) -> None:
    paths = httpx.get(tenants[0].url + "/openapi.json", timeout=10).json()["paths"]
    assert {"post", "get", "delete"} <= set(paths["/v1/responses"]) | set(
        paths["/v1/responses/{response_id}"]
    )
    assert "requestBody" in paths["/v1/responses"]["post"] and "requestBody" in paths["/v1/messages"]["post"]
    assert "get" in paths["/v1/models/{model_id}"]
