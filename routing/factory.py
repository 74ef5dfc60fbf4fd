"""Builds the routing package's stages and background services from the settings.

Wiring (gateway/services.py):
    routing = await create_routing_stages(settings.routing, settings.models, pools, registry)
    routing.cascade_stage, routing.route_stage: the last two stages (the list: gateway/services.py, _stages)
    closers.append(routing.aclose)
"""

import asyncio
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry

from backends.base import Backend
from core.models import ModelConfig
from routing.admission.admission import Admission
from routing.admission.metrics import AdmissionMetrics
from routing.cascade import CascadeStage, ScorerCache
from routing.confidence import Embed, build_scorer, needs_embedder
from routing.config import RoutingSettings
from routing.metrics import RoutingMetrics
from routing.monitor import Monitor
from routing.router import Router
from routing.stage import RouteStage
from routing.token_count import TokenCounter


@dataclass
class RoutingServices:
    router: Router
    route_stage: RouteStage
    cascade_stage: CascadeStage
    monitor: Monitor
    counter: TokenCounter  # prompt tokens on a deployment, outside the pipeline (count_tokens)
    admission: Admission | None = None  # queues per pool when saturated (routing/admission)

    async def aclose(self) -> None:
        if self.admission is not None:
            await self.admission.aclose()
        await self.monitor.aclose()


async def create_routing_stages(
    config: RoutingSettings,
    models: list[ModelConfig],
    pools: dict[str, list[Backend]],
    registry: CollectorRegistry | None = None,
    embedder: Embed | None = None,
) -> RoutingServices:
    """`embedder`: the semantic cache's SentenceEmbedder to share one MiniLM; loaded here when needed."""
    metrics = RoutingMetrics(registry)
    fallbacks = {m.name: m.fallbacks for m in models}
    router = Router(pools, config, fallbacks, metrics)
    if embedder is None and any(needs_embedder(c.confidence) for c in config.cascades):
        embedder = await asyncio.to_thread(_load_embedder)
    deployments = {d.name: d for m in models for d in m.deployments}
    scorers = ScorerCache(lambda confidence: build_scorer(confidence, embedder or _LazyEmbedder()))
    cascade = CascadeStage(config.cascades, scorers, deployments, metrics)
    monitor = Monitor(
        router.all_replicas(),
        config.scrape_interval_s if config.scrape_metrics else None,
        config.health_interval_s if config.health_checks else None,
    )
    await monitor.start()
    admission = None
    if config.admission.enabled:
        metrics_of_admission = AdmissionMetrics(metrics.registry)
        admission = Admission(
            config.admission, lambda: router.pools, metrics_of_admission, config.metrics_stale_s
        )
        admission.start()
    route = RouteStage(router, admission=admission)
    return RoutingServices(router, route, cascade, monitor, TokenCounter(router, cascade), admission)


def _load_embedder() -> Embed:
    from cache.embedder import SentenceEmbedder
    from cache.encoder import build_encoder

    return SentenceEmbedder(build_encoder(None, threads=1, onnx=False))


class _LazyEmbedder:
    """For learned scorers that only tenant policies name: the model loads on first use."""

    def __init__(self) -> None:
        self._embedder: Embed | None = None

    def encode(self, texts: list[str]) -> np.ndarray:
        if self._embedder is None:
            self._embedder = _load_embedder()
        return self._embedder.encode(texts)
