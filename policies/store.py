"""Database access for tenants, keys, policies and model aliases (never on the request path)."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from policies.errors import Conflict, NotFound
from policies.keys import ADMIN_TOKEN_PREFIX, NewKey, generate_key, new_id
from policies.policy import Policy
from policies.tables import AdminTokenRow, ApiKeyRow, ModelAliasRow, PolicyRow, TenantRow, utcnow

_KIND = {
    PolicyRow: "policy",
    TenantRow: "tenant",
    ApiKeyRow: "key",
    ModelAliasRow: "model",
    AdminTokenRow: "admin_token",
}


@dataclass(frozen=True)
class Snapshot:
    """Everything the hot path needs, loaded in one go."""

    keys: list[ApiKeyRow]
    tenants: dict[str, TenantRow]
    policies: dict[str, Policy]
    models: list[dict[str, Any]]


def stored_spec(spec: Policy) -> dict[str, Any]:
    """A policy as the database keeps it. Renamed fields are written under their former name while replicas
    of the previous release may still read the row (they refuse keys they do not know); this release reads
    both (core/renamed.py). reserve_completion_tokens: stored as default_max_tokens."""
    data = spec.model_dump(mode="json")
    if "reserve_completion_tokens" in data:
        data["default_max_tokens"] = data.pop("reserve_completion_tokens")
    return data


class Store:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[AsyncSession]:
        async with self._sessions() as session:
            try:
                async with session.begin():
                    yield session
            except IntegrityError as exc:
                raise Conflict(f"constraint violated: {_constraint_message(exc)}") from None

    async def _get(self, session: AsyncSession, row_type: type, ident: str) -> Any:
        row = await session.get(row_type, ident)
        if row is None:
            raise NotFound(_KIND[row_type], ident)
        return row

    # policies
    async def create_policy(self, name: str, spec: Policy) -> PolicyRow:
        row = PolicyRow(id=new_id("pol"), name=name, spec=stored_spec(spec))
        async with self._tx() as session:
            session.add(row)
        return row

    async def list_policies(self) -> list[PolicyRow]:
        return await self._all(select(PolicyRow).order_by(PolicyRow.created_at))

    async def get_policy(self, policy_id: str) -> PolicyRow:
        async with self._tx() as session:
            return await self._get(session, PolicyRow, policy_id)

    async def update_policy(self, policy_id: str, name: str | None, spec: Policy | None) -> PolicyRow:
        async with self._tx() as session:
            row = await self._get(session, PolicyRow, policy_id)
            if name is not None:
                row.name = name
            if spec is not None:
                row.spec = stored_spec(spec)
        return row

    async def delete_policy(self, policy_id: str) -> None:
        await self._delete(PolicyRow, policy_id)

    # tenants
    async def create_tenant(self, tenant_id: str | None, name: str, policy_id: str | None) -> TenantRow:
        row = TenantRow(id=tenant_id or new_id("ten"), name=name, policy_id=policy_id)
        async with self._tx() as session:
            await self._check_policy(session, policy_id)
            session.add(row)
        return row

    async def list_tenants(self) -> list[TenantRow]:
        return await self._all(select(TenantRow).order_by(TenantRow.created_at))

    async def get_tenant(self, tenant_id: str) -> TenantRow:
        async with self._tx() as session:
            return await self._get(session, TenantRow, tenant_id)

    async def update_tenant(self, tenant_id: str, changes: dict[str, Any]) -> TenantRow:
        async with self._tx() as session:
            row = await self._get(session, TenantRow, tenant_id)
            await self._check_policy(session, changes.get("policy_id"))
            for field, value in changes.items():
                setattr(row, field, value)
        return row

    async def delete_tenant(self, tenant_id: str) -> None:
        async with self._tx() as session:
            for key in await session.scalars(select(ApiKeyRow).where(ApiKeyRow.tenant_id == tenant_id)):
                await session.delete(key)
            await session.delete(await self._get(session, TenantRow, tenant_id))

    # keys
    async def create_key(
        self, tenant_id: str, name: str = "", policy_id: str | None = None, expires_at: datetime | None = None
    ) -> tuple[ApiKeyRow, NewKey]:
        new = generate_key()
        row = ApiKeyRow(id=new_id("key"), tenant_id=tenant_id, name=name, prefix=new.prefix)
        row.key_hash, row.policy_id, row.expires_at = new.key_hash, policy_id, expires_at
        async with self._tx() as session:
            await self._get(session, TenantRow, tenant_id)
            await self._check_policy(session, policy_id)
            session.add(row)
        return row, new

    async def list_keys(self, tenant_id: str | None = None) -> list[ApiKeyRow]:
        query = select(ApiKeyRow).order_by(ApiKeyRow.created_at)
        if tenant_id is not None:
            query = query.where(ApiKeyRow.tenant_id == tenant_id)
        return await self._all(query)

    async def get_key(self, key_id: str) -> ApiKeyRow:
        async with self._tx() as session:
            return await self._get(session, ApiKeyRow, key_id)

    async def update_key(self, key_id: str, changes: dict[str, Any]) -> ApiKeyRow:
        """Change name, policy_id or expires_at (the secret never changes: create a new key instead)."""
        async with self._tx() as session:
            row = await self._get(session, ApiKeyRow, key_id)
            await self._check_policy(session, changes.get("policy_id"))
            for field, value in changes.items():
                setattr(row, field, value)
        return row

    async def revoke_key(self, key_id: str) -> ApiKeyRow:
        async with self._tx() as session:
            row = await self._get(session, ApiKeyRow, key_id)
            row.revoked_at = row.revoked_at or utcnow()
        return row

    # admin tokens (the configured LLMGW_ADMIN_TOKEN is not one of them: it is never stored)
    async def create_admin_token(self, name: str, scope: str) -> tuple[AdminTokenRow, NewKey]:
        new = generate_key(ADMIN_TOKEN_PREFIX)
        row = AdminTokenRow(
            id=new_id("adm"), name=name, scope=scope, prefix=new.prefix, token_hash=new.key_hash
        )
        async with self._tx() as session:
            session.add(row)
        return row, new

    async def list_admin_tokens(self) -> list[AdminTokenRow]:
        return await self._all(select(AdminTokenRow).order_by(AdminTokenRow.created_at))

    async def revoke_admin_token(self, token_id: str) -> AdminTokenRow:
        async with self._tx() as session:
            row = await self._get(session, AdminTokenRow, token_id)
            row.revoked_at = row.revoked_at or utcnow()
        return row

    async def active_admin_token(
        self, *, token_hash: str | None = None, token_id: str | None = None
    ) -> AdminTokenRow | None:
        """The unrevoked admin token with this hash (or id), else None."""
        query = select(AdminTokenRow).where(AdminTokenRow.revoked_at.is_(None))
        if token_hash is not None:
            query = query.where(AdminTokenRow.token_hash == token_hash)
        else:
            query = query.where(AdminTokenRow.id == token_id)
        async with self._sessions() as session:
            return await session.scalar(query)

    # model aliases (merged over the static config)
    async def upsert_model(self, name: str, config: dict[str, Any]) -> ModelAliasRow:
        async with self._tx() as session:
            row = await session.get(ModelAliasRow, name) or ModelAliasRow(name=name)
            row.config = config
            session.add(row)
        return row

    async def list_models(self) -> list[ModelAliasRow]:
        return await self._all(select(ModelAliasRow).order_by(ModelAliasRow.name))

    async def delete_model(self, name: str) -> None:
        await self._delete(ModelAliasRow, name)

    async def load_snapshot(self) -> Snapshot:
        async with self._sessions() as session:
            keys = list(await session.scalars(select(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None))))
            tenants = {row.id: row for row in await session.scalars(select(TenantRow))}
            policies = {
                row.id: Policy.model_validate(row.spec) for row in await session.scalars(select(PolicyRow))
            }
            models = [row.config for row in await session.scalars(select(ModelAliasRow))]
        return Snapshot(keys=keys, tenants=tenants, policies=policies, models=models)

    async def _all(self, query: Any) -> list[Any]:
        async with self._sessions() as session:
            return list(await session.scalars(query))

    async def _delete(self, row_type: type, ident: str) -> None:
        async with self._tx() as session:
            await session.delete(await self._get(session, row_type, ident))

    async def _check_policy(self, session: AsyncSession, policy_id: str | None) -> None:
        if policy_id is not None:
            await self._get(session, PolicyRow, policy_id)


def _constraint_message(exc: IntegrityError) -> str:
    text = str(exc.orig).lower()
    if "unique" in text or "duplicate" in text:
        return "an object with this id or name already exists"
    if "foreign key" in text:
        return "the object is still referenced (e.g. a policy used by a tenant or key)"
    return "invalid reference"
