"""The admin REST API under /admin/v1. Every change reaches all replicas through the notifier."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from core.errors import OpenAIError, bad_request
from core.models import ModelConfig, deployment_clash
from policies.admin.console import console_routes
from policies.admin.http import OpenAIErrorRoute, admin_guard
from policies.admin.inputs import Moment, reject_nul
from policies.admin.plan import plan_routes
from policies.admin.schemas import (
    CacheFeedbackIn,
    CacheFeedbackOut,
    CacheFlushIn,
    CacheFlushOut,
    Deleted,
    KeyCreated,
    KeyIn,
    KeyOut,
    KeyPatch,
    ModelOut,
    PolicyIn,
    PolicyOut,
    TenantIn,
    TenantOut,
    TenantPatch,
    UsageOut,
)
from policies.admin.tokens import admin_token_routes, token_lookup
from policies.directory import Directory
from policies.notify import ChangeNotifier
from policies.policy import Policy
from policies.store import Store
from policies.tables import PolicyRow
from policies.usage_query import GroupBy, aggregate_usage

CacheFlush = Callable[[str | None, str | None], Awaitable[int]]
CacheFeedback = Callable[[str], Awaitable[bool]]  # request id of a semantic hit -> evicted


@dataclass
class AdminDeps:
    store: Store
    engine: AsyncEngine
    directory: Directory
    notifier: ChangeNotifier
    admin_token: SecretStr | None
    cache_flush: CacheFlush | None = field(default=None)
    cache_feedback: CacheFeedback | None = field(default=None)


def create_admin_router(deps: AdminDeps) -> APIRouter:
    router = APIRouter(
        prefix="/admin/v1",
        tags=["admin"],
        route_class=OpenAIErrorRoute,
        dependencies=[Depends(admin_guard(deps.admin_token, token_lookup(deps.store))), Depends(reject_nul)],
    )
    _policy_routes(router, deps)
    _tenant_routes(router, deps)
    _key_routes(router, deps)
    _model_routes(router, deps)
    _usage_routes(router, deps)
    console_routes(router, deps)  # the operator console's figures (gateway/ui/)
    admin_token_routes(router, deps.store)  # scoped admin tokens (read-only or full)
    plan_routes(router)  # capacity planning, as `llmgw plan` (routing/planning)
    return router


def _policy_out(row: PolicyRow) -> PolicyOut:
    return PolicyOut.model_validate(
        {
            **row.spec,
            "name": row.name,
            "id": row.id,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    )


def _spec(body: PolicyIn) -> Policy:
    return Policy.model_validate(body.model_dump(exclude={"name"}))


def _policy_routes(router: APIRouter, deps: AdminDeps) -> None:
    @router.post("/policies", status_code=201, response_model=PolicyOut)
    async def create_policy(body: PolicyIn) -> PolicyOut:
        row = await deps.store.create_policy(body.name, _spec(body))
        await deps.notifier.changed()
        return _policy_out(row)

    @router.get("/policies", response_model=list[PolicyOut])
    async def list_policies() -> list[PolicyOut]:
        return [_policy_out(row) for row in await deps.store.list_policies()]

    @router.get("/policies/{policy_id}", response_model=PolicyOut)
    async def get_policy(policy_id: str) -> PolicyOut:
        return _policy_out(await deps.store.get_policy(policy_id))

    @router.put("/policies/{policy_id}", response_model=PolicyOut)
    async def replace_policy(policy_id: str, body: PolicyIn) -> PolicyOut:
        row = await deps.store.update_policy(policy_id, body.name, _spec(body))
        await deps.notifier.changed()
        return _policy_out(row)

    @router.delete("/policies/{policy_id}", response_model=Deleted)
    async def delete_policy(policy_id: str) -> Deleted:
        await deps.store.delete_policy(policy_id)
        await deps.notifier.changed()
        return Deleted(id=policy_id)


def _tenant_routes(router: APIRouter, deps: AdminDeps) -> None:
    @router.post("/tenants", status_code=201, response_model=TenantOut)
    async def create_tenant(body: TenantIn) -> Any:
        row = await deps.store.create_tenant(body.id, body.name, body.policy_id)
        await deps.notifier.changed()
        return TenantOut.model_validate(row, from_attributes=True)

    @router.get("/tenants", response_model=list[TenantOut])
    async def list_tenants() -> Any:
        return [
            TenantOut.model_validate(row, from_attributes=True) for row in await deps.store.list_tenants()
        ]

    @router.get("/tenants/{tenant_id}", response_model=TenantOut)
    async def get_tenant(tenant_id: str) -> Any:
        return TenantOut.model_validate(await deps.store.get_tenant(tenant_id), from_attributes=True)

    @router.patch("/tenants/{tenant_id}", response_model=TenantOut)
    async def update_tenant(tenant_id: str, body: TenantPatch) -> Any:
        changes = _changes(body)
        if changes.get("name", "") is None:
            raise bad_request("name cannot be null", param="name")
        row = await deps.store.update_tenant(tenant_id, changes)
        await deps.notifier.changed()
        return TenantOut.model_validate(row, from_attributes=True)

    @router.delete("/tenants/{tenant_id}", response_model=Deleted)
    async def delete_tenant(tenant_id: str) -> Deleted:
        await deps.store.delete_tenant(tenant_id)
        await deps.notifier.changed()
        return Deleted(id=tenant_id)


def _key_routes(router: APIRouter, deps: AdminDeps) -> None:
    @router.post("/keys", status_code=201, response_model=KeyCreated)
    async def create_key(body: KeyIn) -> Any:
        expires_at = _naive_utc(body.expires_at)
        row, new = await deps.store.create_key(body.tenant_id, body.name, body.policy_id, expires_at)
        await deps.notifier.changed()
        return KeyCreated.model_validate(
            {**KeyOut.model_validate(row, from_attributes=True).model_dump(), "key": new.secret}
        )

    @router.get("/keys", response_model=list[KeyOut])
    async def list_keys(tenant_id: str | None = None) -> Any:
        return [
            KeyOut.model_validate(row, from_attributes=True) for row in await deps.store.list_keys(tenant_id)
        ]

    @router.get("/keys/{key_id}", response_model=KeyOut)
    async def get_key(key_id: str) -> Any:
        return KeyOut.model_validate(await deps.store.get_key(key_id), from_attributes=True)

    @router.patch("/keys/{key_id}", response_model=KeyOut)
    async def update_key(key_id: str, body: KeyPatch) -> Any:
        changes = _changes(body)
        if "expires_at" in changes:
            changes["expires_at"] = _naive_utc(changes["expires_at"])
        if changes.get("name", "") is None:
            raise bad_request("name cannot be null", param="name")
        row = await deps.store.update_key(key_id, changes)
        await deps.notifier.changed()
        return KeyOut.model_validate(row, from_attributes=True)

    @router.post("/keys/{key_id}/revoke", response_model=KeyOut)
    async def revoke_key(key_id: str) -> Any:
        row = await deps.store.revoke_key(key_id)
        await deps.notifier.changed()
        return KeyOut.model_validate(row, from_attributes=True)


def _model_routes(router: APIRouter, deps: AdminDeps) -> None:
    @router.get("/models", response_model=list[ModelOut])
    async def list_models() -> list[ModelOut]:
        stored = {row.name for row in await deps.store.list_models()}
        return [
            ModelOut(name=m.name, source="database" if m.name in stored else "static", config=m)
            for m in deps.directory.models
        ]

    @router.put("/models/{name}", response_model=ModelOut)
    async def put_model(name: str, body: ModelConfig) -> ModelOut:
        if body.name != name:
            raise bad_request(f"the body's name {body.name!r} differs from the path's {name!r}", param="name")
        others = [m for m in deps.directory.models if m.name != name]
        if (clash := deployment_clash([*others, body])) is not None:
            raise OpenAIError(409, clash, param="deployments", code="conflict")
        await deps.store.upsert_model(name, body.model_dump(mode="json"))
        await deps.notifier.changed()
        return ModelOut(name=name, source="database", config=body)

    @router.delete("/models/{name}", response_model=Deleted)
    async def delete_model(name: str) -> Deleted:
        await deps.store.delete_model(name)
        await deps.notifier.changed()
        return Deleted(id=name)


def _usage_routes(router: APIRouter, deps: AdminDeps) -> None:
    @router.get("/usage", response_model=UsageOut)
    async def usage(
        group_by: Annotated[list[GroupBy] | None, Query(description="repeat to group by several")] = None,
        start: Moment | None = None,
        end: Moment | None = None,
        tenant_id: str | None = None,
        key_id: str | None = None,
        model: str | None = None,
        limit: Annotated[int | None, Query(ge=1, description="only the groups with the most spend")] = None,
    ) -> UsageOut:
        group_by = group_by or ["tenant_id"]
        filters = {k: v for k, v in {"tenant_id": tenant_id, "key_id": key_id, "model": model}.items() if v}
        start, end = _naive_utc(start), _naive_utc(end)
        data = await aggregate_usage(deps.engine, group_by, start, end, filters, limit)
        return UsageOut(start=start, end=end, group_by=list(group_by), data=data)

    @router.post("/cache/flush", response_model=CacheFlushOut)
    async def flush_cache(body: CacheFlushIn) -> CacheFlushOut:
        if deps.cache_flush is None:
            raise OpenAIError(501, "No cache is configured on this gateway.", code="cache_unavailable")
        return CacheFlushOut(flushed=await deps.cache_flush(body.tenant_id, body.model))

    @router.post("/cache/feedback", response_model=CacheFeedbackOut)
    async def cache_feedback(body: CacheFeedbackIn) -> CacheFeedbackOut:
        """The semantic hit served to this request (x-request-id) was wrong: evict its entry, count it."""
        if deps.cache_feedback is None:
            raise OpenAIError(  # no semantic cache, so no semantic hit by that id (not a server fault)
                404,
                "No semantic cache is configured on this gateway, so it served no hit.",
                code="cache_unavailable",
            )
        return CacheFeedbackOut(
            request_id=body.request_id, evicted=await deps.cache_feedback(body.request_id)
        )


def _changes(patch: BaseModel) -> dict[str, Any]:
    """The fields a PATCH sets; one that sets none is a mistake, not a no-op."""
    if not patch.model_fields_set:
        raise OpenAIError(422, "Invalid request: the PATCH body sets no field.", code="invalid_value")
    return patch.model_dump(include=patch.model_fields_set)


def _naive_utc(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)
