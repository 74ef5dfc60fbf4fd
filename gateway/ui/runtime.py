"""What only the running gateway knows, for the console: deployments and their load, routing settings, and
this process's cache counters (Prometheus families read in-process) with its recent semantic hits."""

import time
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from gateway.services import Services

RECENT_SEMANTIC_HITS = 50
CACHE_FAMILIES = {
    "llmgw_cache_lookups": "lookups",
    "llmgw_cache_semantic_verdicts": "verdicts",
    "llmgw_cache_semantic_shadow": "shadow",
    "llmgw_cache_semantic_feedback": "feedback",
    "llmgw_cache_verified_outcomes": "verified_outcomes",
    "llmgw_saved_usd": "saved_usd",
}


def runtime_report(services: Services) -> dict[str, Any]:
    return {
        "deployments": _deployments(services),
        "routing": services.settings.routing.model_dump(mode="json", exclude={"score_weights"}),
        "cache": _cache(services),
        "process": "these figures are this gateway process's, since it started",
    }


def _deployments(services: Services) -> list[dict[str, Any]]:
    router = services.routing.router
    now, stale = router.clock(), router.settings.metrics_stale_s
    rows = []
    for alias, replicas in sorted(router.pools.items()):
        for replica in replicas:
            engine = replica.engine
            fresh = now - engine.at <= stale
            rows.append({
                "alias": alias,
                "deployment": replica.name,
                "engine_pool": replica.engine_pool,
                "breaker": replica.breaker.state,
                "healthy": replica.breaker.available() and not replica.cooling(now),
                "outstanding": replica.outstanding,
                "latency_ewma_ms": round(replica.latency.value * 1000, 1),
                "queue": replica.queue_depth(now, stale),
                "kv_usage": engine.kv_usage if fresh else None,
                "prefix_hit_rate": engine.prefix_hit_rate if fresh else None,
                "waiting": engine.waiting if fresh else None,
                "running": engine.running if fresh else None,
            })  # fmt: skip
    return rows


def _samples(registries: list[CollectorRegistry]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in CACHE_FAMILIES.values()}
    for registry in registries:
        for family in registry.collect():
            name = CACHE_FAMILIES.get(family.name.removesuffix("_total"))
            if name is None:
                continue
            for sample in family.samples:
                if sample.name.endswith(("_total", "")) and not sample.name.endswith("_created"):
                    found[name].append({**sample.labels, "value": sample.value})
    return found


def _cache(services: Services) -> dict[str, Any]:
    counters = _samples([services.observability.metrics.registry, REGISTRY])
    report: dict[str, Any] = {"configured": services.cache is not None, "semantic": False, **counters}
    if services.cache is None:
        return report
    service = services.cache.service
    report["semantic"] = bool(service.semantic)
    report["readiness"] = services.cache.readiness()
    report["defaults"] = service.settings.defaults.model_dump(mode="json")
    recent = list(getattr(service, "_recent_hits", {}).items())[-RECENT_SEMANTIC_HITS:]  # read only
    report["recent_semantic_hits"] = [
        {"request_id": request_id, "similarity": round(match.similarity, 4),
         "verifier": round(match.probability, 4), "namespace": str(getattr(match.candidate, "namespace", ""))}
        for request_id, match in reversed(recent)
    ]  # fmt: skip
    report["at"] = time.time()
    return report
