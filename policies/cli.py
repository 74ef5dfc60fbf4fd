"""`llmgw keys create|list|revoke`: manage virtual keys in the configured database (LLMGW_*)."""

import argparse
import asyncio
import sys
from collections.abc import Sequence

from policies.errors import Conflict, NotFound
from policies.provision import StoreSettings, ensure_tenant, open_store
from policies.tables import ApiKeyRow


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmgw", description="Manage virtual API keys.")
    keys = (
        parser.add_subparsers(dest="group", required=True)
        .add_parser("keys")
        .add_subparsers(dest="action", required=True)
    )
    create = keys.add_parser("create", help="create a key; its secret is printed once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", default="")
    create.add_argument("--policy", help="policy id overriding the tenant's policy for this key")
    create.add_argument("--create-tenant", action="store_true", help="create the tenant if it does not exist")
    listing = keys.add_parser("list", help="list keys (prefixes only, never secrets)")
    listing.add_argument("--tenant")
    revoke = keys.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("key_id")
    return parser


def main(argv: Sequence[str] | None, settings: StoreSettings) -> int:
    """`settings`: the gateway's (gateway/cli.py loads them)."""
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_run(args, settings))
    except (NotFound, Conflict) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace, settings: StoreSettings) -> int:
    async with open_store(
        settings, migrate=settings.policies.migrates_at_start(settings.database_url)
    ) as store:
        if args.action == "create":
            if args.create_tenant:
                await ensure_tenant(store, args.tenant)
            row, new = await store.create_key(args.tenant, args.name, args.policy)
            print(
                f"id: {row.id}\ntenant: {row.tenant_id}\nkey: {new.secret}\n(store the key now: it is not shown again)"
            )
        elif args.action == "list":
            for row in await store.list_keys(args.tenant):
                print(_describe(row))
        else:
            print(_describe(await store.revoke_key(args.key_id)))
    return 0


def _describe(row: ApiKeyRow) -> str:
    state = f"revoked {row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "active"
    return f"{row.id}  {row.prefix}…  tenant={row.tenant_id}  name={row.name or '-'}  {state}"
