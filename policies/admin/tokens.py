"""Admin tokens under /admin/v1/admin-tokens: scoped (`read` or `admin`), stored as a sha256 hash, the secret
shown once in the creation's answer, revocable at once on every replica (each admin call looks its token up).

The configured LLMGW_ADMIN_TOKEN is none of them: it keeps every right and is never stored.
"""

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from policies.admin.http import ADMIN, READ, TokenLookup
from policies.admin.schemas import Timestamp
from policies.store import Store


class AdminTokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=200)
    scope: Literal["read", "admin"] = READ


class AdminTokenOut(BaseModel):
    id: str
    name: str
    scope: Literal["read", "admin"]
    prefix: str
    created_at: Timestamp  # UTC with its offset, as every admin answer's times
    revoked_at: Timestamp | None


class AdminTokenCreated(AdminTokenOut):
    token: str  # the secret: shown in this answer only


def token_lookup(store: Store) -> TokenLookup:
    async def scope_of(token_hash: str) -> str | None:
        row = await store.active_admin_token(token_hash=token_hash)
        return row.scope if row is not None and row.scope in (READ, ADMIN) else None

    return scope_of


def admin_token_routes(router: APIRouter, store: Store) -> None:
    @router.post("/admin-tokens", status_code=201, response_model=AdminTokenCreated)
    async def create_admin_token(body: AdminTokenIn) -> Any:
        row, new = await store.create_admin_token(body.name, body.scope)
        return AdminTokenCreated.model_validate(
            {**AdminTokenOut.model_validate(row, from_attributes=True).model_dump(), "token": new.secret}
        )

    @router.get("/admin-tokens", response_model=list[AdminTokenOut])
    async def list_admin_tokens() -> Any:
        return [
            AdminTokenOut.model_validate(r, from_attributes=True) for r in await store.list_admin_tokens()
        ]

    @router.post("/admin-tokens/{token_id}/revoke", response_model=AdminTokenOut)
    async def revoke_admin_token(token_id: str) -> Any:
        return AdminTokenOut.model_validate(await store.revoke_admin_token(token_id), from_attributes=True)
