"""Virtual keys on the proxy path: key → tenant + policy from memory; unknown, revoked, expired → 401."""

from datetime import timedelta

import pytest

from core.context import Reply, RequestContext
from core.errors import OpenAIError
from gateway.pipeline import chain
from policies.policy import Limits, Policy
from policies.tables import utcnow
from tests.policies_support import MASTER_KEY, database_fixture, make_settings, provision, start  # noqa: F401


def request(secret: str | None, model: str = "small") -> RequestContext:
    headers = {"authorization": f"Bearer {secret}"} if secret else {}
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return RequestContext(request_id="r1", endpoint="chat", body=body, headers=headers, model=model)


async def answer(ctx: RequestContext) -> Reply:
    return Reply(body={"principal": ctx.principal.tenant_id, "policy": ctx.policy})


async def call(services, ctx: RequestContext) -> Reply:
    return await chain([*services.stages, _terminal])(ctx)


async def _terminal(ctx, call_next):
    return await answer(ctx)


async def test_keys_resolve_to_tenant_and_policy_and_revocation_refuses(database):
    services = await start(make_settings(database))
    try:
        key_id, secret = await provision(services, Policy(allowed_models=["small"]))
        reply = await call(services, request(secret))
        assert reply.body["principal"] == "acme" and reply.body["policy"].allowed_models == ["small"]
        await services.store.revoke_key(key_id)
        await services.notifier.changed()
        with pytest.raises(OpenAIError) as refused:
            await call(services, request(secret))
        assert refused.value.status == 401 and refused.value.code == "invalid_api_key"
        assert secret not in refused.value.message
    finally:
        await services.aclose()


async def test_unknown_missing_and_expired_keys_are_401(database):
    services = await start(make_settings(database))
    try:
        await provision(services, Policy())
        for ctx in (request("sk-gw-not-a-key"), request(None)):
            with pytest.raises(OpenAIError) as refused:
                await call(services, ctx)
            assert refused.value.status == 401
        _, expired = await services.store.create_key(
            "acme", "old", expires_at=utcnow() - timedelta(seconds=1)
        )
        await services.notifier.changed()
        with pytest.raises(OpenAIError) as refused:
            await call(services, request(expired.secret))
        assert refused.value.status == 401
    finally:
        await services.aclose()


async def test_model_outside_policy_is_404_model_not_found(database):
    services = await start(make_settings(database))
    try:
        _, secret = await provision(services, Policy(allowed_models=["small"]))
        with pytest.raises(OpenAIError) as refused:
            await call(services, request(secret, model="large"))
        assert refused.value.status == 404 and refused.value.code == "model_not_found"
    finally:
        await services.aclose()


async def test_key_policy_overrides_tenant_policy_and_master_key_has_all_access(database):
    services = await start(make_settings(database))
    try:
        await provision(services, Policy(allowed_models=["small"]))
        own = await services.store.create_policy("key-own", Policy(key_limits=Limits(rpm=7)))
        _, new = await services.store.create_key("acme", "special", policy_id=own.id)
        await services.notifier.changed()
        reply = await call(services, request(new.secret, model="large"))
        assert reply.body["policy"].key_limits.rpm == 7
        master = await call(services, request(MASTER_KEY, model="anything"))
        assert master.body == {"principal": "master", "policy": None}
    finally:
        await services.aclose()
