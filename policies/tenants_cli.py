"""`llmgw tenants list|service`: a tenant's service class and weight for a saturated pool (routing/admission).

    llmgw tenants service acme --class batch --weight 2    # acme's requests queue behind interactive ones
    llmgw tenants list                                      # id, policy, class, weight

The class and weight live in the tenant's policy (`routing.service_class`, `routing.weight`). A policy
used by this tenant alone is changed in place; one shared with other tenants is copied first (named
`<policy> (<tenant>)`), so the others keep theirs. Running gateways reload at once (Redis) or within
`refresh_interval_s`.
"""

import argparse
from collections.abc import Sequence

from policies.policy import Policy
from policies.provision import StoreSettings, open_store
from policies.store import Store
from routing.admission.config import CLASS_NAMES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmgw tenants", description="Tenants' service classes.")
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="tenants with their policy, service class and weight")
    service = actions.add_parser("service", help="set a tenant's service class and weight")
    service.add_argument("tenant")
    service.add_argument("--class", dest="service_class", choices=CLASS_NAMES, help="priority band")
    service.add_argument("--weight", type=float, help="share against tenants of the same class (default 1)")
    return parser


async def run(argv: Sequence[str], settings: StoreSettings) -> int:
    args = build_parser().parse_args(list(argv))
    async with open_store(
        settings, migrate=settings.policies.migrates_at_start(settings.database_url)
    ) as store:
        if args.action == "list":
            for line in await _listing(store):
                print(line)
            return 0
        if args.weight is not None and not 0 < args.weight <= 1000:
            raise ValueError("--weight must be above 0 and at most 1000")
        print(await set_service(store, args.tenant, args.service_class, args.weight))
    return 0


async def set_service(store: Store, tenant_id: str, service_class: str | None, weight: float | None) -> str:
    tenant = await store.get_tenant(tenant_id)
    shared = tenant.policy_id is not None and any(
        t.policy_id == tenant.policy_id and t.id != tenant_id for t in await store.list_tenants()
    )
    current = await store.get_policy(tenant.policy_id) if tenant.policy_id else None
    spec = Policy.model_validate(current.spec) if current else Policy()
    routing = {**spec.routing}
    routing.update({k: v for k, v in (("service_class", service_class), ("weight", weight)) if v is not None})
    changed = spec.model_copy(update={"routing": routing})
    Policy.model_validate(changed.model_dump())  # the routing section checked as the admin API would
    if current is not None and not shared:
        await store.update_policy(current.id, None, changed)
        policy_id = current.id
    else:
        name = f"{current.name} ({tenant_id})" if current else f"{tenant_id}-policy"
        policy_id = (await store.create_policy(name, changed)).id
        await store.update_tenant(tenant_id, {"policy_id": policy_id})
    return f"{tenant_id}: policy {policy_id}, class {routing.get('service_class', 'default')}, " + (
        f"weight {routing.get('weight', 1)}"
    )


async def _listing(store: Store) -> list[str]:
    lines = []
    for tenant in await store.list_tenants():
        routing = {}
        if tenant.policy_id:
            routing = Policy.model_validate((await store.get_policy(tenant.policy_id)).spec).routing
        lines.append(
            f"{tenant.id}  policy={tenant.policy_id or '-'}  class={routing.get('service_class', 'default')}  "
            f"weight={routing.get('weight', 1)}"
        )
    return lines
