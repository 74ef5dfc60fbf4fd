"""Builds everything this package runs: the proxy stages, the admin router and their services.

Wiring (gateway/services.py):
    policy = await create_policy_services(settings.policies, settings.connections(), settings.models)
    policy.stages: auth, policy, limits, accounting (in the stage list: gateway/services.py, _stages)
    app.include_router(policy.admin_router)
    policy.on_models_changed(<router>.update_models)                 # DB-managed aliases
    policy.set_cache_flush(<cache>.flush)                             # async (tenant_id, model) -> int
    ... on shutdown: await policy.aclose()
"""

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from core.context import Stage
from core.models import ModelConfig
from policies.accounting import AccountingStage
from policies.admin.router import AdminDeps, CacheFlush, create_admin_router
from policies.auth import AuthStage, PolicyStage
from policies.config import Connections, PoliciesSettings, RedisOptions
from policies.db import create_engine, session_factory
from policies.directory import Directory, ModelsListener
from policies.migrate import upgrade_engine
from policies.notify import ChangeNotifier
from policies.ratelimit.buckets import Limiter
from policies.ratelimit.factory import build_limiter, cost_estimator
from policies.ratelimit.failover import FailoverLimiter
from policies.ratelimit.seed import seed_spend
from policies.ratelimit.stage import RateLimitStage
from policies.redis_connect import redis_py_client
from policies.rollups import RollupCompactor
from policies.store import Store
from policies.usage_writer import UsageWriter


@dataclass
class PolicyServices:
    engine: AsyncEngine
    store: Store
    directory: Directory
    notifier: ChangeNotifier
    usage: UsageWriter
    limiter: Limiter
    ratelimit_stage: RateLimitStage
    auth: AuthStage  # also asked alone, before a body is read (Services.authenticate)
    stages: list[Stage]  # auth, policy, rate limit & budget, accounting (usage records): in this order
    admin: AdminDeps
    admin_router: APIRouter
    redis_clients: list[Redis]
    rollups: RollupCompactor | None = None  # hourly usage rollups (policies/rollups.py)

    def on_models_changed(self, listener: ModelsListener) -> None:
        """`listener(models)` runs on every replica when DB-managed model aliases change."""
        self.directory.on_models_changed(listener)

    def limiter_readiness(self) -> dict[str, Any] | None:
        """The rate limiter's Redis state for /health/ready (None: no Redis, the in-process limiter)."""
        return self.limiter.readiness() if isinstance(self.limiter, FailoverLimiter) else None

    def set_cache_flush(self, flush: CacheFlush) -> None:
        self.admin.cache_flush = flush

    async def aclose(self) -> None:
        await self.ratelimit_stage.aclose()
        await self.notifier.aclose()
        await self.usage.aclose()
        if self.rollups is not None:
            await self.rollups.aclose()
        for client in self.redis_clients:
            await client.aclose()
        await self.engine.dispose()


async def create_policy_services(
    config: PoliciesSettings,
    connections: Connections,
    models: list[ModelConfig],
    cache_flush: CacheFlush | None = None,
) -> PolicyServices:
    database_url = connections.database_url
    engine = create_engine(database_url, config.db_schema, config.database)
    if config.migrates_at_start(database_url):
        await upgrade_engine(engine)
    store = Store(session_factory(engine))
    directory = Directory(store, models)
    await directory.reload()
    clients = _redis_clients(connections.redis_url, config.redis)
    limiter = await build_limiter(config, connections.redis_url)
    await seed_spend(engine, limiter, datetime.now(UTC))
    notifier = ChangeNotifier(
        directory, clients[0] if clients else None, config.redis_prefix + "changes", config.refresh_interval_s
    )
    notifier.start()
    usage = UsageWriter(
        engine,
        config.usage_queue_size,
        config.usage_batch_size,
        config.usage_flush_interval_s,
        config.usage_retry_max_s,
        config.usage_shutdown_timeout_s,
    )
    usage.start()
    prices = cost_estimator(lambda: directory.models)
    ratelimit = RateLimitStage(limiter, config.reserve_completion_tokens, config.concurrency_lease_s, prices)
    auth = AuthStage(directory, connections.master_key.get_secret_value())
    stages: list[Stage] = [
        auth,
        PolicyStage(directory),
        ratelimit,
        AccountingStage(usage),
    ]
    admin = AdminDeps(store, engine, directory, notifier, connections.admin_token, cache_flush)
    rollups = None  # the rollups serve the admin API's usage figures: kept only where it is on
    if connections.admin_token is not None:
        rollups = RollupCompactor(engine, config.usage_rollup_interval_s, config.usage_rollup_batch)
        rollups.start()
    return PolicyServices(
        engine,
        store,
        directory,
        notifier,
        usage,
        limiter,
        ratelimit,
        auth,
        stages,
        admin,
        create_admin_router(admin),
        clients,
        rollups,
    )


def _redis_clients(url: str | None, options: RedisOptions) -> list[Redis]:
    """The pub/sub client (long-lived connection); the rate limiter has its own (ratelimit/resp.py)."""
    if url is None:
        return []
    return [redis_py_client(url, options, socket_connect_timeout=2.0, health_check_interval=15)]
