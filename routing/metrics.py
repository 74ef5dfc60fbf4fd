"""Prometheus series of the routing package. Pass the gateway's registry in; each registry gets one set."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
QUALITY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


class RoutingMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry or CollectorRegistry()
        self.registry = registry
        self._outstanding: dict[str, Gauge] = {}
        self.breaker_state = Gauge(
            "llmgw_deployment_circuit_state", "Circuit breaker: 0 closed, 1 half-open, 2 open.",
            ["deployment"], registry=registry,
        )  # fmt: skip
        self.outstanding = Gauge(
            "llmgw_deployment_outstanding_requests", "Requests in flight per deployment.",
            ["deployment"], registry=registry,
        )  # fmt: skip
        self.retries = Counter(
            "llmgw_routing_retries", "Attempts after a failed one, before the first byte.",
            ["model", "deployment"], registry=registry,
        )  # fmt: skip
        self.retries_denied = Counter(
            "llmgw_routing_retries_denied", "Retries not sent: the deployment's retry budget was spent.",
            ["model", "deployment"], registry=registry,
        )  # fmt: skip
        self.fallbacks = Counter(
            "llmgw_routing_fallbacks", "Requests handed to a fallback alias.", ["model", "fallback"],
            registry=registry,
        )  # fmt: skip
        self.failures = Counter(
            "llmgw_deployment_failures", "Failed calls per deployment.", ["deployment", "stage"],
            registry=registry,
        )  # fmt: skip
        self.cascade = Counter(
            "llmgw_cascade_decisions", "Cascade outcomes.", ["model", "outcome"], registry=registry
        )
        self.cascade_quality = Histogram(
            "llmgw_cascade_quality_estimate",
            "Estimated P(correct) of each small answer a cascade judged, by outcome (learned confidence: "
            "the model's probability; logprob methods: the answer's geometric-mean token probability).",
            ["model", "outcome"], buckets=QUALITY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.cascade_escalation_cost = Counter(
            "llmgw_cascade_escalation_cost_usd",
            "What the small attempts of escalated cascade requests cost (paid on top of the large model's answer): "
            "the cascade's net saving is llmgw_saved_usd{source=\"cascade\"} minus this.",
            ["model"], registry=registry,
        )  # fmt: skip
        self.cascade_unscored = Counter(
            "llmgw_cascade_unscored_escalations",
            "Cascade escalations the confidence did not decide, by reason: the small model failed, answered "
            "nothing, or was cut short by max_small_tokens (a cap below the traffic's answers shows here).",
            ["model", "reason"], registry=registry,
        )  # fmt: skip
        self.cascade_threshold = Gauge(
            "llmgw_cascade_threshold",
            "The confidence threshold a cascade with escalate_share applies now (the share's quantile of its "
            "recent scores; its fixed threshold during warm-up).",
            ["model"], registry=registry,
        )  # fmt: skip

    def set_outstanding(self, deployment: str, count: int) -> None:
        """The deployment's in-flight gauge; its child is looked up once (labels() costs microseconds, and
        every request sets it twice)."""
        child = self._outstanding.get(deployment)
        if child is None:
            child = self._outstanding[deployment] = self.outstanding.labels(deployment)
        child.set(count)

    def set_breaker(self, deployment: str, state: str) -> None:
        self.breaker_state.labels(deployment).set(BREAKER_STATES[state])
