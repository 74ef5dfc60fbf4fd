"""The in-memory view of keys, policies and model aliases: the request path reads only this."""

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from core.context import Principal
from core.models import DeploymentConfig, ModelConfig
from policies.policy import Policy
from policies.store import Snapshot, Store

log = logging.getLogger(__name__)
ModelsListener = Callable[[list[ModelConfig]], Awaitable[None] | None]


@dataclass(frozen=True)
class KeyEntry:
    principal: Principal
    policy: Policy | None
    expires_at: datetime | None


class Directory:
    def __init__(self, store: Store, static_models: list[ModelConfig]) -> None:
        self._store = store
        self._static_models = static_models
        self._keys: dict[str, KeyEntry] = {}
        self._by_key_id: dict[str, KeyEntry] = {}
        self._models: list[ModelConfig] = list(static_models)
        self._listeners: list[ModelsListener] = []
        self._lock = asyncio.Lock()

    def lookup(self, key_hash: str) -> KeyEntry | None:
        return self._keys.get(key_hash)

    def policy_for(self, key_id: str) -> Policy | None:
        entry = self._by_key_id.get(key_id)
        return entry.policy if entry else None

    @property
    def models(self) -> list[ModelConfig]:
        """The static models with the database's aliases merged over them (same name wins)."""
        return self._models

    def deployment(self, name: str | None) -> DeploymentConfig | None:
        deployments = (d for model in self._models for d in model.deployments)
        return next((d for d in deployments if d.name == name), None)

    def on_models_changed(self, listener: ModelsListener) -> None:
        self._listeners.append(listener)

    async def reload(self) -> None:
        async with self._lock:
            snapshot = await self._store.load_snapshot()
            self._keys = _key_entries(snapshot)
            self._by_key_id = {entry.principal.key_id: entry for entry in self._keys.values()}
            models = _merge_models(self._static_models, snapshot.models)
            changed, self._models = models != self._models, models
        if changed:
            await self._notify(models)

    async def _notify(self, models: list[ModelConfig]) -> None:
        for listener in self._listeners:
            result = listener(models)
            if inspect.isawaitable(result):
                await result


def _key_entries(snapshot: Snapshot) -> dict[str, KeyEntry]:
    entries = {}
    for key in snapshot.keys:
        tenant = snapshot.tenants.get(key.tenant_id)
        if tenant is None:
            continue
        policy_id = key.policy_id or tenant.policy_id
        principal = Principal(tenant_id=tenant.id, key_id=key.id, key_prefix=key.prefix)
        policy = snapshot.policies.get(policy_id) if policy_id else None
        entries[key.key_hash] = KeyEntry(principal, policy, key.expires_at)
    return entries


def _merge_models(static: list[ModelConfig], stored: list[dict]) -> list[ModelConfig]:
    merged = {model.name: model for model in static}
    for config in stored:
        try:
            model = ModelConfig.model_validate(config)
        except ValidationError as exc:
            log.error("ignoring invalid stored model alias %r: %s", config.get("name"), exc)
            continue
        merged[model.name] = model
    return list(merged.values())
