"""GET /v1/models/{id}: the SDK's models.retrieve, OpenAI's shape and 404 model_not_found."""

import openai
import pytest

from tests.conftest import MASTER_KEY
from tests.fakes import ServerThread


@pytest.fixture
def client(gateway: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER_KEY, max_retries=0)


def test_retrieve_a_model(client: openai.OpenAI) -> None:
    model = client.models.retrieve("fake-model")
    assert (model.id, model.object, model.owned_by) == ("fake-model", "model", "llmgw")


def test_unknown_model_is_404_model_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as error:
        client.models.retrieve("org/missing-model")
    assert error.value.body["code"] == "model_not_found"


def test_retrieve_needs_a_key(gateway: ServerThread) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.retrieve("fake-model")


def test_an_alias_says_who_owns_it(upstream) -> None:
    from gateway.app import create_app
    from tests.conftest import fake_models, gateway_settings

    models = [m.model_copy(update={"owned_by": "acme-ml"}) for m in fake_models(upstream[1].url)]
    with ServerThread(create_app(gateway_settings(upstream[1].url, models=models))) as gateway:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=MASTER_KEY, max_retries=0)
        assert client.models.retrieve("fake-model").owned_by == "acme-ml"
        assert [m.owned_by for m in client.models.list().data] == ["acme-ml"]
