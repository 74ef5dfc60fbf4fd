"""Writes the provisioned Grafana dashboards (deploy/grafana/dashboards/*.json) from the panel lists below.

Edit the lists, run `python deploy/grafana/build_dashboards.py`, commit both. A test checks the JSON files
match this script, and the Prometheus proof test runs every expression against a real Prometheus.
Every panel uses the Prometheus datasource by its fixed uid (see provisioning/datasources/prometheus.yml).
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "llmgw-prometheus"}
OUT = Path(__file__).resolve().parent / "dashboards"
RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    description: str = ""


def rate(selector: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({selector}{RATE}))"


def quantiles(
    metric: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.95, 0.99)
) -> tuple[tuple[str, str], ...]:
    labels = ", ".join(["le", *([by] if by else [])])
    legend = f"{{{{{by}}}}} " if by else ""
    return tuple(
        (f"histogram_quantile({q}, {rate(metric + '_bucket', labels)})", f"{legend}p{round(q * 100)}")
        for q in qs
    )


def ratio(numerator: str, denominator: str) -> str:
    """A share that reads 0, not 'no data', when the numerator has no series yet."""
    return f"({numerator} or vector(0)) / {denominator}"


REQUESTS = "llmgw_requests_total"
OVERVIEW = [
    Panel("Requests per second by model", "reqps", ((rate(REQUESTS, "model"), "{{model}}"),)),
    Panel("Error rate", "percentunit", (
        (ratio(rate(REQUESTS + '{status_class="5xx"}'), rate(REQUESTS)), "5xx"),
        (ratio(rate(REQUESTS + '{status_class="4xx"}'), rate(REQUESTS)), "4xx"),
    ), "Share of requests answered with an error status"),
    Panel("End-to-end latency", "s", quantiles("llmgw_request_duration_seconds"),
          "Arrival to the last byte handed to the client"),
    Panel("Time to first token (streams)", "s", quantiles("llmgw_time_to_first_token_seconds")),
    Panel("Gateway overhead", "s", quantiles("llmgw_gateway_overhead_seconds", "stream", (0.5, 0.99)),
          "Time to the client's first byte minus the time waiting for upstream (gateway/observe.py)"),
    Panel("Inter-token latency (streams)", "s", quantiles("llmgw_inter_token_latency_seconds", qs=(0.5, 0.95))),
    Panel("Requests in flight", "short", (("sum by (model) (llmgw_requests_in_flight)", "{{model}}"),)),
    Panel("Answers by cache status", "reqps", ((rate(REQUESTS, "cache_status"), "{{cache_status}}"),)),
]  # fmt: skip

SAVED = "llmgw_saved_usd_total"
COST = "llmgw_cost_usd_total"
KEPT_QUALITY = 'llmgw_cascade_quality_estimate_{}{{outcome="small"}}'  # _sum / _count of the kept answers
CASCADE_SOURCE = '{source="cascade"}'
CASCADE_SAVED = rate(SAVED + CASCADE_SOURCE, "model")
ESCALATION_COST = rate("llmgw_cascade_escalation_cost_usd_total", "model")
BILLED_TOKENS = 'llmgw_tokens_total{kind!="cached"}'
COST_AND_SAVINGS = [
    Panel("Tokens per second by model", "short", ((rate("llmgw_tokens_total", "model, kind"), "{{model}} {{kind}}"),)),
    Panel("Spend by model (USD per hour)", "currencyUSD", ((f"3600 * {rate(COST, 'model')}", "{{model}}"),)),
    Panel("Spend by tenant over the range (USD)", "currencyUSD",
          ((f"sum by (tenant) (increase({COST}[$__range]))", "{{tenant}}"),)),
    Panel("Tokens by tenant over the range", "short",
          (("sum by (tenant, kind) (increase(llmgw_tokens_total[$__range]))", "{{tenant}} {{kind}}"),)),
    Panel("Cost per 1k tokens by model (USD)", "currencyUSD", ((
        f"1000 * {rate(COST, 'model')} / {rate(BILLED_TOKENS, 'model')}", "{{model}}",
    ),)),
    Panel("Cache hit rate", "percentunit", ((ratio(
        rate(REQUESTS + '{cache_status=~"hit|semantic-hit"}'), rate(REQUESTS + '{cache_status!="bypass"}')
    ), "hit rate"),), "Exact and semantic hits among requests that looked the cache up"),
    Panel("Savings (USD per hour)", "currencyUSD", ((f"3600 * {rate(SAVED, 'source')}", "{{source}}"),),
          "Cache hits priced at the alias price; cascades kept on the small model vs the large model's price"),
    Panel("Savings share of would-be spend", "percentunit", ((
        f"{rate(SAVED)} / ({rate(SAVED)} + {rate(COST)})", "saved",
    ),)),
    Panel("Tokens served from the cache per second", "short",
          ((rate("llmgw_cache_saved_tokens_total", "kind"), "{{kind}}"),)),
    Panel("Semantic cache similarity (nearest entry)", "percentunit",
          quantiles("llmgw_cache_similarity", "result", (0.1, 0.5))),
    Panel("Semantic cache: estimated false-hit rate", "percentunit", ((ratio(
        rate('llmgw_cache_semantic_shadow_total{outcome="disagree"}'), rate("llmgw_cache_semantic_shadow_total")
    ), "shadow-checked hits whose fresh answer disagreed"), (
        rate("llmgw_cache_semantic_feedback_total", "source"), "reported wrong ({{source}}) per second",
    )), "A sampled share of semantic hits is also answered upstream and the answers compared"),
    Panel("Semantic cache (verified mode): labelled outcomes per second", "short", (
        (rate("llmgw_cache_verified_outcomes_total", "source, outcome"), "{{source}} {{outcome}}"),
    ), "The outcomes that certify verified mode's thresholds: explored misses (the fresh answer against the best "
       "candidate's), shadow re-asks of verified hits, feedback (header, admin)"),
    Panel("Semantic cache (verified mode): wrong share of labelled outcomes", "percentunit", ((ratio(
        rate('llmgw_cache_verified_outcomes_total{outcome="wrong"}', "source"),
        rate("llmgw_cache_verified_outcomes_total", "source"),
    ), "{{source}}"),), "Among candidates labelled, the share whose stored answer was wrong for the question"),
    Panel("Cascade decisions per second", "reqps", (
        (rate("llmgw_cascade_decisions_total", "outcome"), "{{outcome}}"),
        (rate("llmgw_cascade_unscored_escalations_total", "reason"), "escalated, not scored: {{reason}}"),
    ), "Not scored: the small model failed, answered nothing, or hit max_small_tokens (cut_short: a cap "
       "below the traffic's answers escalates them whatever the confidence)"),
    Panel("Cascade escalation rate and estimated quality", "percentunit", ((ratio(
        rate('llmgw_cascade_decisions_total{outcome="escalated"}'), rate("llmgw_cascade_decisions_total")
    ), "escalated"), (
        f"{rate(KEPT_QUALITY.format('sum'))} / {rate(KEPT_QUALITY.format('count'))}",
        "estimated accuracy of kept small answers",
    )), "Share of cascade requests sent to the large model, and the mean estimated P(correct) of the small "
        "answers kept (learned confidence: its probability, bench/README.md gives its measured calibration)"),
    Panel("Cascade saving (USD per hour)", "currencyUSD", (
        (f"3600 * ({CASCADE_SAVED} or {ESCALATION_COST} * 0) - 3600 * ({ESCALATION_COST} or {CASCADE_SAVED} * 0)",
         "{{model}} net"),
        (f"3600 * {CASCADE_SAVED}", "{{model}} kept small answers"),
        (f"3600 * {ESCALATION_COST}", "{{model}} small attempts escalated"),
    ), "Net: kept small answers priced at the large model's price minus what they cost, less what the small "
       "attempts of escalated requests cost (below zero: the cascade costs more than the large model alone)"),
    Panel("Cascade threshold in use (escalate_share)", "short",
          (("max by (model) (llmgw_cascade_threshold)", "{{model}}"),),
          "Cascades with confidence.escalate_share: the quantile of recent scores their threshold follows"),
]  # fmt: skip

BACKENDS = [
    Panel("Running and waiting requests (engines)", "short", (
        ("sum by (model_name, instance) (vllm:num_requests_running)", "{{instance}} running"),
        ("sum by (model_name, instance) (vllm:num_requests_waiting)", "{{instance}} waiting"),
    )),
    Panel("KV-cache usage", "percentunit",
          (("max by (model_name, instance) (vllm:kv_cache_usage_perc)", "{{instance}}"),)),
    Panel("Prefix-cache hit rate", "percentunit", ((
        f"{rate('vllm:prefix_cache_hits_total', 'instance')} / {rate('vllm:prefix_cache_queries_total', 'instance')}",
        "{{instance}}",
    ),)),
    Panel("Preemptions per second", "short", ((rate("vllm:num_preemptions_total", "instance"), "{{instance}}"),)),
    Panel("Engine busy and step budget used (our engine)", "percentunit", (
        (rate("llmgw_engine_step_seconds_total", "instance"), "{{instance}} in steps"),
        (rate("llmgw_engine_budget_seconds_total", "instance"), "{{instance}} step budget used"),
    ), "Share of time the engine loop spent in steps, and that time weighted by the share of each step's token "
       "budget scheduled: near 1, the engine runs full steps (vLLM does not export these)"),
    Panel("Engine generation throughput (tokens/s)", "short", (
        (rate("vllm:generation_tokens_total", "instance"), "{{instance}} generated"),
        (rate("vllm:prompt_tokens_total", "instance"), "{{instance}} prompt"),
    )),
    Panel("Engine TTFT p95 / ITL p95", "s", (
        (f"histogram_quantile(0.95, {rate('vllm:time_to_first_token_seconds_bucket', 'le, instance')})",
         "{{instance}} TTFT"),
        # vLLM before 0.11 (the image docker-compose.yml pins) names it time_per_output_token_seconds
        ("histogram_quantile(0.95, sum by (le, instance) (rate(vllm:inter_token_latency_seconds_bucket"
         f"{RATE}) or rate(vllm:time_per_output_token_seconds_bucket{RATE})))", "{{instance}} ITL"),
    )),
    Panel("TTFT p95 per deployment (gateway view)", "s",
          quantiles("llmgw_time_to_first_token_seconds", "deployment", (0.95,))),
    Panel("Inter-token latency p95 per deployment (gateway view)", "s",
          quantiles("llmgw_inter_token_latency_seconds", "deployment", (0.95,))),
    Panel("Backend up (scrape)", "short", (('up{job="vllm"}', "{{instance}}"),)),
    Panel("Circuit breaker (0 closed, 1 half-open, 2 open)", "short",
          (("max by (deployment) (llmgw_deployment_circuit_state)", "{{deployment}}"),)),
    Panel("Outstanding requests per deployment", "short",
          (("sum by (deployment) (llmgw_deployment_outstanding_requests)", "{{deployment}}"),)),
    Panel("Retries and fallbacks per second", "short", (
        (rate("llmgw_routing_retries_total", "deployment"), "retry {{deployment}}"),
        (rate("llmgw_routing_fallbacks_total", "model, fallback"), "fallback {{model}} → {{fallback}}"),
    )),
]  # fmt: skip

LIMITS = [
    Panel("Rejections by limit kind (per second)", "reqps",
          ((rate("llmgw_ratelimit_rejections_total", "kind"), "{{kind}}"),)),
    Panel("429 share of requests", "percentunit", ((ratio(rate(REQUESTS + '{status="429"}'), rate(REQUESTS)), "429"),)),
    Panel("Daily budget burn by tenant", "percentunit", ((
        f"sum by (tenant) (increase({COST}[1d])) / max by (tenant) (llmgw_tenant_budget_usd{{period=\"day\"}})",
        "{{tenant}}",
    ),), "Spend over the last 24 h against the tenant's daily budget (needs tenant labels)"),
    Panel("Spend rate by tenant (USD per hour)", "currencyUSD", ((f"3600 * {rate(COST, 'tenant')}", "{{tenant}}"),)),
]  # fmt: skip

SLO = "llmgw_admission_slo_requests_total"
JUDGED = '{outcome!="cancelled"}'  # a client that left while its request still met the SLO: no verdict
OVERLOAD = [
    Panel("Requests waiting for a slot, by class", "short",
          (("sum by (model, class) (llmgw_admission_queue_depth)", "{{model}} {{class}}"),),
          "Held in the gateway while the pool is saturated (routing/admission); summed over replicas"),
    Panel("Wait for a slot p50 / p95, by class", "s", quantiles("llmgw_admission_wait_seconds", "class", (0.5, 0.95)),
          "Arrival to a slot of the pool (0 when it had room); also the span admission.queue"),
    Panel("Refused by admission (per second), by class and reason", "reqps",
          ((rate("llmgw_admission_shed_total", "class, reason"), "{{class}} {{reason}}"),),
          "deadline: could not start in time, refused at once; expired: waited its deadline out; queue_full; "
          "pool_down (503). All carry Retry-After"),
    Panel("SLO attainment (goodput) by class", "percentunit", ((ratio(
        rate(SLO + '{outcome="met"}', "class"), rate(SLO + JUDGED, "class")
    ), "{{class}}"),), "Requests within their class's TTFT and inter-token targets, among all (refused count "
       "as missed) but those whose client left while still within them"),
    Panel("SLO attainment (goodput) by tenant", "percentunit", ((ratio(
        rate(SLO + '{outcome="met"}', "tenant, class"), rate(SLO + JUDGED, "tenant, class")
    ), "{{tenant}} ({{class}})"),)),
    Panel("Served tokens per second by tenant (fair shares)", "short",
          ((rate("llmgw_admission_served_tokens_total", "model, tenant"), "{{model}} {{tenant}}"),)),
    Panel("Pool slots and requests running", "short", (
        ("max by (model) (llmgw_admission_pool_slots)", "{{model}} slots (NaN: not learned yet)"),
        ("sum by (model) (llmgw_admission_running)", "{{model}} running (all replicas)"),
    ), "Slots: the deployments' max_concurrency, or learned from the engines' running and waiting counts"),
    Panel("Latency feedback: part of its pool share a class may fill", "percentunit",
          (("min by (model, class) (llmgw_admission_share_factor)", "{{model}} {{class}}"),),
          "Below 1 while a class ranked above it misses its TTFT target (routing.admission.slo_guard); "
          "lowest over replicas"),
]  # fmt: skip

DASHBOARDS = {
    "llmgw-overview": ("LLM gateway: overview", OVERVIEW),
    "llmgw-cost": ("LLM gateway: cost and savings", COST_AND_SAVINGS),
    "llmgw-backends": ("LLM gateway: backends", BACKENDS),
    "llmgw-limits": ("LLM gateway: limits and budgets", LIMITS),
    "llmgw-overload": ("LLM gateway: overload, priority classes and fair shares", OVERLOAD),
}


def panel_json(panel: Panel, index: int) -> dict[str, Any]:
    targets = [
        {
            "refId": chr(ord("A") + i),
            "datasource": DATASOURCE,
            "expr": expr,
            "legendFormat": legend,
            "range": True,
        }
        for i, (expr, legend) in enumerate(panel.queries)
    ]
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": targets,
    }


def dashboard_json(uid: str, title: str, panels: list[Panel]) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "tags": ["llmgw"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": ["llmgw"], "title": "llmgw dashboards", "asDropdown": True}],
        "panels": [panel_json(p, i) for i, p in enumerate(panels)],
    }


def render_all() -> dict[str, str]:
    """File name → JSON text, for every dashboard."""
    return {
        f"{uid}.json": json.dumps(dashboard_json(uid, title, panels), indent=2, ensure_ascii=False) + "\n"
        for uid, (title, panels) in DASHBOARDS.items()
    }


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, text in render_all().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
