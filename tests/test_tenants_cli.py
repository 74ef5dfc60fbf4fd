"""`llmgw tenants service|list`: a tenant's service class and weight, without touching tenants that share
its policy."""

from policies.policy import Limits, Policy
from policies.provision import ensure_tenant, open_store
from policies.tenants_cli import run
from tests.policies_support import Database, database_fixture, make_settings  # noqa: F401


async def test_service_class_is_set_in_the_tenants_own_policy_and_shared_ones_are_copied(database, capsys):
    settings = make_settings(database)
    async with open_store(settings) as store:
        shared = await store.create_policy("team", Policy(key_limits=Limits(rpm=60)))
        await store.create_tenant("acme", "Acme", shared.id)
        await store.create_tenant("globex", "Globex", shared.id)
        await ensure_tenant(store, "solo")
    assert await run(["service", "acme", "--class", "batch", "--weight", "2"], settings) == 0
    assert await run(["service", "solo", "--class", "interactive"], settings) == 0
    async with open_store(settings) as store:
        acme, globex = await store.get_tenant("acme"), await store.get_tenant("globex")
        assert globex.policy_id == shared.id and acme.policy_id != shared.id  # the shared one was copied
        copied = Policy.model_validate((await store.get_policy(acme.policy_id)).spec)
        assert copied.routing == {"service_class": "batch", "weight": 2.0} and copied.key_limits.rpm == 60
        assert Policy.model_validate((await store.get_policy(shared.id)).spec).routing == {}
        policy_id = acme.policy_id
    assert await run(["service", "acme", "--weight", "3"], settings) == 0  # its own now: changed in place
    async with open_store(settings) as store:
        assert (await store.get_tenant("acme")).policy_id == policy_id
        assert Policy.model_validate((await store.get_policy(policy_id)).spec).routing["weight"] == 3.0
    capsys.readouterr()
    assert await run(["list"], settings) == 0
    listed = capsys.readouterr().out
    assert (
        "acme" in listed
        and "class=batch" in listed
        and "weight=3.0" in listed
        and "class=interactive" in listed
    )
