"""The gateway's Prometheus metrics: definitions, bounded labels and recording methods.

Build one `GatewayMetrics` per process at start-up (`GatewayMetrics.from_settings(settings)`) and pass it to
whatever records. `ObserveStage` (gateway/observe.py) records all that the request context shows: requests,
end-to-end latency, time to first token, inter-token latency, gateway overhead, tokens, cost, cache status
and savings, cascade decisions and savings, in-flight requests and tenant budgets.

Other packages record what only they see. The cache calls, on the instance it is given:
    record_cache_lookup(layer, hit, similarity=None)  each "exact" or "semantic" lookup
Packages with their own families register them in `GatewayMetrics.registry` (routing.metrics.RoutingMetrics:
circuit state, outstanding, retries, fallbacks, failures, cascade decisions) or in the process-wide registry
(policies.metrics: llmgw_ratelimit_rejections_total{kind}, usage records); /metrics serves both.

Labels stay bounded: `model` is a configured alias or "other"; `deployment` a configured deployment, "none"
(answered without one, e.g. a cache hit) or "other"; `tenant` is empty (Prometheus drops empty labels)
unless ObservabilitySettings.tenant_label is on, and then capped at max_tenant_labels. Never keys or text.

Several uvicorn workers: set PROMETHEUS_MULTIPROC_DIR to an empty directory, shared by the workers, before
they start; `render_metrics` then sums every worker's files (each gauge declares its multiprocess mode).
"""

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

from core.context import CacheNote, RequestContext
from core.models import ModelConfig
from core.usage import Usage
from gateway.observability_config import ObservabilitySettings
from gateway.settings import Settings

# Sub-millisecond gateway work up to multi-minute generations.
E2E_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 40, 80)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
SIMILARITY_BUCKETS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.92, 0.94, 0.96, 0.98, 0.99, 1.0)
CACHE_STATUSES = frozenset({"hit", "semantic-hit", "miss", "bypass"})
CACHE_HITS = frozenset({"hit", "semantic-hit"})
REQUEST_LABELS = ("model", "deployment", "endpoint", "status", "status_class", "cache_status", "tenant")


@dataclass(frozen=True)
class Outcome:
    """How one request ended, as measured by the observe stage. Times in seconds; None = not measured."""

    status: int | str  # the HTTP status, or "cancelled" when the client went away mid-stream
    e2e_s: float
    ttft_s: float | None = None
    overhead_s: float | None = None


@dataclass(frozen=True)
class Price:
    """USD per token, the weight-averaged price of an alias's deployments."""

    input: float
    output: float

    def cost(self, usage: Usage) -> float:
        return usage.prompt_tokens * self.input + usage.completion_tokens * self.output


def alias_price(model: ModelConfig) -> Price:
    total = sum(d.weight for d in model.deployments) or 1.0
    mean_in = sum(d.input_price_per_1m * d.weight for d in model.deployments) / total
    mean_out = sum(d.output_price_per_1m * d.weight for d in model.deployments) / total
    return Price(mean_in / 1e6, mean_out / 1e6)


def alias_prices(settings: Settings) -> dict[str, Price]:
    """Every public alias's expected price; a static cascade's alias is priced as its large model."""
    prices = {m.name: alias_price(m) for m in settings.models}
    for cascade in getattr(settings.routing, "cascades", ()):
        if cascade.large in prices:
            prices[cascade.alias] = prices[cascade.large]
    return prices


class Labeller:
    """Maps free-form values to bounded label values."""

    def __init__(self, settings: ObservabilitySettings, aliases: Iterable[str], deployments: Iterable[str]):
        self._aliases = frozenset(aliases)
        self._deployments = frozenset(deployments)
        self._tenants: set[str] = set()
        self._tenant_label = settings.tenant_label
        self._max_tenants = settings.max_tenant_labels

    def model(self, alias: str) -> str:
        return alias if alias in self._aliases else "other"

    def deployment(self, name: str | None) -> str:
        if name is None:
            return "none"
        return name if name in self._deployments else "other"

    def tenant(self, ctx: RequestContext) -> str:
        if not self._tenant_label or ctx.principal is None:
            return ""
        tenant = ctx.principal.tenant_id
        if tenant not in self._tenants and len(self._tenants) >= self._max_tenants:
            return "other"
        self._tenants.add(tenant)
        return tenant

    @property
    def tenants_enabled(self) -> bool:
        return self._tenant_label


class GatewayMetrics:
    """The metric families and the methods that record into them."""

    def __init__(
        self,
        labeller: Labeller,
        prices: dict[str, Price],
        registry: CollectorRegistry | None = None,
        enabled: bool = True,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.labels = labeller
        self.enabled = enabled
        self._prices = prices
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._define(self.registry)

    def _at(self, metric: Counter | Gauge | Histogram, *values: str) -> Any:
        """metric.labels(*values), memoised: labels() costs microseconds, and label values are bounded."""
        key = (metric._name, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    @classmethod
    def from_settings(cls, settings: Settings, registry: CollectorRegistry | None = None) -> "GatewayMetrics":
        obs = observability_settings(settings)
        deployments = [d.name for m in settings.models for d in m.deployments]
        prices = alias_prices(settings)
        return cls(Labeller(obs, prices, deployments), prices, registry, enabled=obs.metrics_enabled)

    def set_models(self, settings: Settings) -> None:
        """Aliases and deployments changed (admin API): new ones get their own label values and prices."""
        fresh = GatewayMetrics.from_settings(settings, CollectorRegistry())
        self.labels, self._prices = fresh.labels, fresh._prices

    def _define(self, r: CollectorRegistry) -> None:
        self.requests = Counter("llmgw_requests", "Requests answered", REQUEST_LABELS, registry=r)
        self.duration = Histogram(
            "llmgw_request_duration_seconds",
            "Arrival to last byte handed to the client",
            ("model", "deployment", "cache_status", "stream"),
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "llmgw_time_to_first_token_seconds",
            "Streams: arrival to the first chunk carrying a token",
            ("model", "deployment"),
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "llmgw_inter_token_latency_seconds",
            "Streams: time between successive chunks carrying tokens",
            ("model", "deployment"),
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "llmgw_gateway_overhead_seconds",
            "Time to the client's first byte (stream) or whole answer, minus the time waiting for upstream",
            ("model", "stream"),
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "llmgw_requests_in_flight",
            "Requests being answered",
            ("model",),
            multiprocess_mode="livesum",
            registry=r,
        )
        self._define_usage(r)
        self._define_savings(r)

    def _define_usage(self, r: CollectorRegistry) -> None:
        self.tokens = Counter(
            "llmgw_tokens",
            "Tokens by kind: input, output, cached (input tokens served from a prefix cache)",
            ("model", "deployment", "kind", "tenant"),
            registry=r,
        )
        self.cost = Counter("llmgw_cost_usd", "Spend in USD", ("model", "deployment", "tenant"), registry=r)
        self.budget = Gauge(
            "llmgw_tenant_budget_usd",
            "A tenant's budget ceiling in USD, by period (day, month)",
            ("tenant", "period"),
            multiprocess_mode="max",
            registry=r,
        )

    def _define_savings(self, r: CollectorRegistry) -> None:
        self.cache_lookups = Counter(
            "llmgw_cache_lookups", "Cache lookups by layer (exact, semantic)", ("layer", "result"), registry=r
        )
        self.cache_similarity = Histogram(
            "llmgw_cache_similarity",
            "Semantic cache: similarity of the nearest entry",
            ("result",),
            buckets=SIMILARITY_BUCKETS,
            registry=r,
        )
        self.saved_tokens = Counter(
            "llmgw_cache_saved_tokens",
            "Tokens not generated upstream thanks to the cache",
            ("model", "kind"),
            registry=r,
        )
        self.saved_usd = Counter(
            "llmgw_saved_usd",
            "USD not spent: cache hits at the alias price; cascades kept small, vs the alias price",
            ("model", "source"),
            registry=r,
        )

    # Recorded by the observe stage.

    def request_started(self, ctx: RequestContext) -> None:
        if self.enabled:
            ctx.in_flight_model = self.labels.model(ctx.model)
            self._at(self.in_flight, ctx.in_flight_model).inc()

    def request_finished(self, ctx: RequestContext, outcome: Outcome) -> None:
        if not self.enabled:
            return
        model, deployment = self.labels.model(ctx.model), self.labels.deployment(ctx.deployment)
        cache_status = ctx.cache_status if ctx.cache_status in CACHE_STATUSES else "other"
        tenant = self.labels.tenant(ctx)
        self._at(self.in_flight, ctx.in_flight_model or model).dec()
        self._at(
            self.requests,
            model,
            deployment,
            ctx.endpoint,
            str(outcome.status),
            _status_class(outcome.status),
            cache_status,
            tenant,
        ).inc()
        stream = "true" if ctx.stream else "false"
        self._at(self.duration, model, deployment, cache_status, stream).observe(outcome.e2e_s)
        self._record_latencies(model, deployment, stream, outcome)
        self._record_usage(ctx, model, deployment, tenant)
        self._record_savings(ctx, model, cache_status)

    def inter_token(self, ctx: RequestContext, seconds: float) -> None:
        if self.enabled:
            self._at(self.itl, self.labels.model(ctx.model), self.labels.deployment(ctx.deployment)).observe(
                seconds
            )

    def _record_latencies(self, model: str, deployment: str, stream: str, outcome: Outcome) -> None:
        if outcome.ttft_s is not None:
            self._at(self.ttft, model, deployment).observe(outcome.ttft_s)
        if outcome.overhead_s is not None:
            self._at(self.overhead, model, stream).observe(max(outcome.overhead_s, 0.0))

    def _record_usage(self, ctx: RequestContext, model: str, deployment: str, tenant: str) -> None:
        usage = ctx.usage
        for kind, count in (
            ("input", usage.prompt_tokens),
            ("output", usage.completion_tokens),
            ("cached", usage.cached_tokens),
        ):
            if count:
                self._at(self.tokens, model, deployment, kind, tenant).inc(count)
        if ctx.cost_usd:
            self._at(self.cost, model, deployment, tenant).inc(ctx.cost_usd)
        self._record_budget(ctx, tenant)

    def _record_budget(self, ctx: RequestContext, tenant: str) -> None:
        budget = getattr(ctx.policy, "tenant_budget", None)
        if not tenant or budget is None:
            return
        for period, ceiling in (("day", budget.usd_per_day), ("month", budget.usd_per_month)):
            if ceiling is not None:
                self._at(self.budget, tenant, period).set(ceiling)

    def _record_savings(self, ctx: RequestContext, model: str, cache_status: str) -> None:
        price = self._prices.get(ctx.model)
        if cache_status in CACHE_HITS:
            saved = ctx.cache or CacheNote(cache_status)
            self._at(self.saved_tokens, model, "input").inc(saved.saved_prompt_tokens)
            self._at(self.saved_tokens, model, "output").inc(saved.saved_completion_tokens)
            saved_usage = Usage(saved.saved_prompt_tokens, saved.saved_completion_tokens)
            saved_usd = saved.saved_cost_usd or (price.cost(saved_usage) if price else 0.0)
            self._at(self.saved_usd, model, "cache").inc(saved_usd)
        if cache_status != "bypass":  # one exact lookup, then a semantic one where the exact layer missed
            self.record_cache_lookup("exact", cache_status == "hit")
            if cache_status == "semantic-hit" or (ctx.cache is not None and ctx.cache.status == "miss"):
                similarity = ctx.cache.similarity if ctx.cache else None
                self.record_cache_lookup("semantic", cache_status == "semantic-hit", similarity)
        if ctx.cascade == "small" and price:
            self._at(self.saved_usd, model, "cascade").inc(max(price.cost(ctx.usage) - ctx.cost_usd, 0.0))

    # Recorded by other packages (see the module docstring).

    def record_cache_lookup(self, layer: str, hit: bool, similarity: float | None = None) -> None:
        if not self.enabled:
            return
        result = "hit" if hit else "miss"
        self._at(self.cache_lookups, layer, result).inc()
        if similarity is not None:
            self._at(self.cache_similarity, result).observe(similarity)


def _status_class(status: int | str) -> str:
    return f"{status // 100}xx" if isinstance(status, int) else str(status)


def observability_settings(settings: Settings) -> ObservabilitySettings:
    """settings.observability once the lead nests it; the defaults until then."""
    return getattr(settings, "observability", None) or ObservabilitySettings()


def render_metrics(metrics: GatewayMetrics) -> tuple[bytes, str]:
    """The /metrics body and content type: every worker's metrics in multiprocess mode, else this process's
    gateway metrics plus the process-wide registry (other packages' metrics, process and GC collectors)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(metrics.registry) + generate_latest(REGISTRY), CONTENT_TYPE_LATEST
