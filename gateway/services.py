"""Everything with a lifetime (backends, stores, background tasks), built once at start-up from settings.

`_stages` below IS the request pipeline, in order: the one place the stage list is written (the README
and gateway/pipeline.py point here). Each factory gets its own settings section only.
"""

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter
from redis.asyncio import Redis

from backends.registry import Backends
from cache.factory import CacheComponents, create_cache
from core.context import Handler, Policy, Principal, RequestContext, Stage
from core.errors import OpenAIError, model_not_found
from core.models import ModelConfig
from gateway.lifecycle import Drain, DrainStage, close_within
from gateway.observe import Observability, create_observability
from gateway.pipeline import chain
from gateway.settings import Settings, database_problem
from gateway.tracing import Tracing, create_tracing
from policies.auth import MASTER
from policies.ratelimit.connect import RedisRefused
from policies.redis_connect import redis_py_client
from policies.service import PolicyServices, create_policy_services
from routing.admission.fleet import FleetSync
from routing.factory import RoutingServices, create_routing_stages


@dataclass
class Services:
    settings: Settings
    backends: Backends
    observability: Observability
    policy: PolicyServices
    routing: RoutingServices
    cache: CacheComponents | None
    stages: list[Stage]
    handler: Handler
    drain: Drain
    closers: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)
    tracing: Tracing | None = None  # OpenTelemetry, when settings.tracing.enabled

    @property
    def admin_router(self) -> APIRouter:
        return self.policy.admin_router

    def owner_of(self, alias: str) -> str:
        """A model card's `owned_by`: the alias's own (ModelConfig.owned_by), "llmgw" for cascades."""
        return next((m.owned_by for m in self.policy.directory.models if m.name == alias), "llmgw")

    def model_names(self) -> list[str]:
        return sorted(self.routing.router.pools)

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """Who calls, by the auth stage alone: a 401 for no key or a bad one. The HTTP layer asks before it
        reads a body, so the answer does not depend on what the body holds."""
        return self.policy.auth.principal_for(dict(headers))

    def reject(self, ctx: RequestContext, error: OpenAIError) -> None:
        """Count and log a request refused before the pipeline (its key, its body) as the pipeline would."""
        self.observability.stage.rejected(ctx, error)
        if self.tracing is not None:
            self.tracing.rejected(ctx, error.status)

    def policy_of(self, principal: Principal) -> Policy | None:
        """The caller's tenant policy (None: the master key, or a key without one)."""
        return self.policy.directory.policy_for(principal.key_id) if principal is not MASTER else None

    async def visible_models(self, headers: Mapping[str, str]) -> list[str]:
        """The aliases this caller may use (GET /v1/models)."""
        policy = self.policy_of(self.authenticate(headers))
        return [name for name in self.model_names() if policy is None or policy.allows(name)]

    async def count_tokens(self, principal: Principal, chat: dict[str, Any], request_id: str) -> int:
        """`chat`'s prompt tokens on a deployment of its model, for a caller allowed that model."""
        policy = self.policy_of(principal)
        if policy is not None and not policy.allows(chat["model"]):
            raise model_not_found(chat["model"])
        return await self.routing.counter.count(chat, policy, request_id)

    async def apply_models(self, models: list[ModelConfig]) -> None:
        """Model aliases changed (admin API, on every replica): re-pool, re-route, re-price."""
        pools = await self.backends.apply(models)
        self.routing.router.set_pools(pools)
        self.routing.monitor.set_replicas(self.routing.router.all_replicas())
        deployments = {d.name: d for m in models for d in m.deployments}
        self.routing.cascade_stage.set_deployments(deployments)
        self.observability.metrics.set_models(self.settings.model_copy(update={"models": models}))

    async def readiness(self) -> dict[str, Any]:
        if self.drain.draining:
            return {"ready": False, "draining": True}
        backends = self.backends.all()
        healthy = await asyncio.gather(*(b.health() for b in backends))
        status = {b.name: ok for b, ok in zip(backends, healthy, strict=True)}
        report: dict[str, Any] = {"ready": any(healthy) or not backends, "deployments": status}
        reasons = {b.name: reason for b in backends if (reason := b.unready_reason()) is not None}
        if reasons:  # e.g. a local engine whose model failed to load: it will not become ready by itself
            report["reasons"] = reasons
        if self.cache is not None:
            report["cache"] = self.cache.readiness()  # semantic caching on, or why it is off
        limiter = self.policy.limiter_readiness()
        if limiter is not None:  # the rate limiter's Redis: refused credentials are never ready
            report["rate_limiter"] = limiter
            report["ready"] = report["ready"] and limiter["ready"]
        return report

    async def aclose(self) -> None:
        """Closes what start_services opened, in reverse order, within the shutdown grace period."""
        await close_within(list(reversed(self.closers)), self.settings.shutdown_grace_s)


def redis_connector(settings: Settings, user: str) -> Callable[[], Redis] | None:
    """How the cache and the Responses store reach Redis: as the rate limiter does (LLMGW_POLICIES__REDIS__*:
    TLS CA and client certificate, Sentinel), not from the URL alone. The cache's multi-key transactions
    need one node: a Cluster is refused for it at start; the Responses store follows the slots."""
    url, options = settings.redis_url, settings.policies.redis
    if url is None:
        return None

    def connect() -> Redis:
        if options.cluster and user == "cache":
            raise ValueError(
                "the cache's Redis store needs one Redis node (multi-key transactions), not a Cluster: "
                "set LLMGW_CACHE__STORE=memory, or give the cache a non-cluster Redis"
            )
        return redis_py_client(url, options, cluster_client=options.cluster)

    return connect


class DatabaseUnusable(RuntimeError):
    """The policies' database (or the rate limiter's Redis, RedisRefused) failed at start; the message is
    one line for the operator (no password)."""


async def start_services(settings: Settings) -> Services:
    closers: list[Callable[[], Awaitable[Any]]] = []
    try:
        return await _start(settings, closers)
    except BaseException:
        for close in reversed(closers):  # a half-started gateway leaves no child process or socket behind
            await close()
        raise


async def _start(settings: Settings, closers: list[Callable[[], Awaitable[Any]]]) -> Services:
    backends = Backends(settings.engine, settings.engine_startup_timeout_s)
    closers.append(backends.aclose)
    pools = await backends.apply(settings.models)
    observability = create_observability(settings)
    cache = await create_cache(settings.cache, settings.redis_url, connect=redis_connector(settings, "cache"))
    if cache:
        closers.append(cache.aclose)
    embedder = cache.service.embedder if cache else None
    routing = await create_routing_stages(
        settings.routing, settings.models, pools, observability.metrics.registry, embedder
    )
    closers.append(routing.aclose)
    flush = cache.service.flush if cache else None
    try:
        policy = await create_policy_services(
            settings.policies, settings.connections(), settings.models, flush
        )
    except RedisRefused as error:
        raise DatabaseUnusable(str(error)) from error
    except Exception as error:
        problem = database_problem(error)
        if problem is None:
            raise
        raise DatabaseUnusable(problem) from error
    if cache and cache.service.semantic:
        policy.admin.cache_feedback = cache.service.feedback
    closers.append(policy.aclose)
    _share_admission(settings, routing, policy, closers)
    drain = Drain(settings.shutdown_grace_s)
    stages = _stages(observability, policy, drain, cache, routing)
    tracing = create_tracing(settings.tracing)
    if tracing:
        closers.insert(0, tracing.aclose)  # closed last: flushes the spans of the final requests
    handler = tracing.pipeline(stages) if tracing else chain(stages)
    services = Services(settings, backends, observability, policy, routing, cache, stages, handler, drain,
                        closers, tracing)  # fmt: skip
    policy.on_models_changed(services.apply_models)
    if policy.directory.models != settings.models:
        await services.apply_models(policy.directory.models)
    return services


def _share_admission(
    settings: Settings,
    routing: RoutingServices,
    policy: PolicyServices,
    closers: list[Callable[[], Awaitable[Any]]],
) -> None:
    """With Redis, the replicas' admission queues share each pool's slots and the tenants' shares."""
    if routing.admission is None or not settings.routing.admission.fleet or not policy.redis_clients:
        return
    client = fleet_client(settings, policy.redis_clients[0])
    if client is not policy.redis_clients[0]:
        closers.insert(0, client.aclose)
    fleet = FleetSync(routing.admission, client, settings.policies.redis_prefix)
    fleet.start()
    closers.insert(0, fleet.aclose)


def fleet_client(settings: Settings, shared: Redis) -> Redis:
    """The admission fleet's Redis: the policies' shared client, or on a Cluster a client that follows the
    slots (a pool's keys share one slot, fleet.py; a plain client to one node meets MOVED)."""
    if settings.policies.redis.cluster and settings.redis_url:
        return redis_py_client(settings.redis_url, settings.policies.redis, cluster_client=True)
    return shared


def _stages(
    observability: Observability,
    policy: PolicyServices,
    drain: Drain,
    cache: CacheComponents | None,
    routing: RoutingServices,
) -> list[Stage]:
    """The request pipeline, first stage first; each package's stages together, so a request crosses
    each package once. A stage's end-of-reply hook runs after those of the stages below it."""
    return [
        observability.stage,  # metrics and the access log see every outcome (gateway/observe.py)
        DrainStage(drain),  # on shutdown, work past the grace period ends with a 503 / an error event
        *policy.stages,  # key → tenant, policy, rate limits and budgets, usage records (policies/)
        *(cache.stages if cache else []),  # exact cache → semantic cache (cache/)
        routing.cascade_stage,  # small → large, when the alias is a cascade (routing/cascade.py)
        routing.route_stage,  # balancing, affinity, retries, fallbacks; prices each attempt (routing/stage.py)
    ]
