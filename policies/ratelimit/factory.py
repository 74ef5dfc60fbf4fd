"""Builds the rate limiter from the policies settings: in-process alone, or Redis behind a failover."""

from collections.abc import Callable

from core.models import DeploymentConfig, ModelConfig, cost_usd
from policies.config import PoliciesSettings
from policies.ratelimit.buckets import Limiter
from policies.ratelimit.connect import check_access, open_pool
from policies.ratelimit.failover import FailoverLimiter
from policies.ratelimit.local_limiter import LocalLimiter
from policies.ratelimit.redis_limiter import RedisLimiter
from policies.ratelimit.replicas import ReplicaCount
from policies.ratelimit.stage import CostEstimate


async def build_limiter(config: PoliciesSettings, redis_url: str | None) -> Limiter:
    """Connects and checks access (connect.check_access: raises RedisRefused when Redis refuses this
    gateway); the replica heartbeat starts here."""
    local = LocalLimiter(config.window_s, config.concurrency_lease_s)
    if redis_url is None:
        return local
    pool = open_pool(redis_url, config.redis, config.redis_timeout_s)
    prefix = config.redis_prefix + "rl:"
    shared = RedisLimiter(pool, prefix, config.window_s, config.concurrency_lease_s)
    try:
        await check_access(pool, shared.probe)
    except BaseException:
        pool.close()
        raise
    replicas = ReplicaCount(pool, prefix + "replicas", config.replicas, config.replica_heartbeat_s)
    replicas.start()
    return FailoverLimiter(shared, local, config.redis_failure_mode, config.redis_retry_s, replicas)


def cost_estimator(models: Callable[[], list[ModelConfig]]) -> CostEstimate:
    """The reservation on budgets: the tokens at the dearest prices among the alias's deployments."""

    seen: list[ModelConfig] | None = None
    by_name: dict[str, list[DeploymentConfig]] = {}

    def estimate(model: str, prompt_tokens: int, completion_tokens: int) -> float:
        nonlocal seen, by_name
        current = models()
        if current is not seen:  # aliases changed (a reload makes a new list): index them again
            seen, by_name = current, {m.name: m.deployments for m in reversed(current)}  # first one wins
        deployments = by_name.get(model, [])
        return max((cost_usd(d, prompt_tokens, completion_tokens) for d in deployments), default=0.0)

    return estimate
