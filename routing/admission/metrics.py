"""Prometheus series of admission: per pool (model), class and tenant — queue, waits, refusals, goodput."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from routing.admission.fair import Ticket

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry or CollectorRegistry()
        self.queued = Gauge(
            "llmgw_admission_queue_depth", "Requests waiting in the gateway for a slot of the pool.",
            ["model", "class"], registry=registry,
        )  # fmt: skip
        self.running = Gauge(
            "llmgw_admission_running", "Requests holding a slot of the pool (this replica).",
            ["model", "class"], registry=registry,
        )  # fmt: skip
        self.slots = Gauge(
            "llmgw_admission_pool_slots",
            "The pool's estimated capacity in concurrent requests, any allowed engine queue "
            "(routing.admission.engine_queue) included (NaN: not known yet, nothing is held).",
            ["model"], registry=registry,
        )  # fmt: skip
        self.wait = Histogram(
            "llmgw_admission_wait_seconds", "Time from arrival to a slot (0 when the pool had room).",
            ["model", "class"], buckets=WAIT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.shed_total = Counter(
            "llmgw_admission_shed",
            "Requests refused by admission: deadline (could not start in time, refused at once), expired "
            "(waited its deadline out), queue_full, pool_down (503).",
            ["model", "class", "tenant", "reason"], registry=registry,
        )  # fmt: skip
        self.slo = Counter(
            "llmgw_admission_slo_requests",
            "Requests by SLO outcome: met (TTFT and mean inter-token latency within the class's targets), "
            "missed, shed, failed (an error), cancelled (the client left while still within them). Goodput = "
            "met / all but cancelled.",
            ["model", "class", "tenant", "outcome"], registry=registry,
        )  # fmt: skip
        self.share_factor = Gauge(
            "llmgw_admission_share_factor",
            "Part of its pool_share a class may fill now: below 1 while a class above it misses its TTFT "
            "target (latency feedback).", ["model", "class"], registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "llmgw_admission_served_tokens", "Prompt + completion tokens served, per tenant (fair shares).",
            ["model", "class", "tenant"], registry=registry,
        )  # fmt: skip

    def started(self, model: str, ticket: Ticket, waited_s: float) -> None:
        self.wait.labels(model, ticket.service).observe(waited_s)

    def shed(self, model: str, ticket: Ticket, reason: str) -> None:
        self.shed_total.labels(model, ticket.service, ticket.tenant, reason).inc()
        self.slo.labels(model, ticket.service, ticket.tenant, "shed").inc()

    def served(self, model: str, ticket: Ticket, tokens: int) -> None:
        self.tokens.labels(model, ticket.service, ticket.tenant).inc(tokens)

    def outcome(self, model: str, ticket: Ticket, outcome: str) -> None:
        self.slo.labels(model, ticket.service, ticket.tenant, outcome).inc()

    def set_queued(self, model: str, service: str, depth: int) -> None:
        self.queued.labels(model, service).set(depth)

    def set_running(self, model: str, service: str, count: int) -> None:
        self.running.labels(model, service).set(count)

    def set_share_factors(self, model: str, factors: dict[str, float]) -> None:
        for service, factor in factors.items():
            self.share_factor.labels(model, service).set(factor)

    def set_slots(self, model: str, slots: float | None) -> None:
        self.slots.labels(model).set(float("nan") if slots is None else slots)
