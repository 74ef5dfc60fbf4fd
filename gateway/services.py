"""Everything with a lifetime (backends, stores, background tasks), built once at start-up from settings."""

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backends.base import Backend
from backends.registry import build_pools
from gateway.accounting import AccountingStage
from gateway.auth import MasterKeyAuth
from gateway.context import Handler, RequestContext, Stage
from gateway.pipeline import chain
from gateway.settings import Settings
from routing.stage import RouteStage


@dataclass
class Services:
    settings: Settings
    pools: dict[str, list[Backend]]
    stages: list[Stage]
    handler: Handler
    closers: list[Any] = field(default_factory=list)

    def model_names(self) -> list[str]:
        return sorted(self.pools)

    async def authenticate(self, headers: Mapping[str, str]) -> None:
        """Runs the pipeline's auth stage alone (for routes outside the pipeline, e.g. /v1/models)."""
        ctx = RequestContext(request_id="", endpoint="models", body={}, headers=dict(headers), model="")
        await self.stages[0](ctx, _accept)

    async def readiness(self) -> dict[str, Any]:
        backends = [b for pool in self.pools.values() for b in pool]
        healthy = await asyncio.gather(*(b.health() for b in backends))
        status = {b.name: ok for b, ok in zip(backends, healthy, strict=True)}
        return {"ready": any(healthy) or not backends, "deployments": status}

    async def aclose(self) -> None:
        for closer in reversed(self.closers):
            await closer()


async def _accept(ctx: RequestContext) -> Any:
    return None


async def start_services(settings: Settings) -> Services:
    pools = build_pools(settings)
    backends = [b for pool in pools.values() for b in pool]
    await asyncio.gather(*(b.start() for b in backends))
    stages: list[Stage] = [
        MasterKeyAuth(settings.master_key.get_secret_value()),
        AccountingStage(settings),
        RouteStage(pools),
    ]
    closers = [b.aclose for b in backends]
    return Services(settings, pools, stages, chain(stages), closers)
