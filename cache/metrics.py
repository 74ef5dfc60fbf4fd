"""Prometheus metrics of the semantic cache (process-wide, like policies.metrics); /metrics serves them.

The online false-hit estimate: a sampled share of semantic hits is also answered upstream in the
background (cache/shadow.py) and the two answers compared. Estimated false-hit rate =
    rate(llmgw_cache_semantic_shadow_total{outcome="disagree"}) / rate(llmgw_cache_semantic_shadow_total)
(deploy/prometheus/alerts.yml, Grafana "Cache" row). The gauge holds the same ratio over this process's
last SHADOW_WINDOW comparisons, for a quick look without PromQL."""

from prometheus_client import Counter, Gauge

SEMANTIC_VERDICTS = Counter(
    "llmgw_cache_semantic_verdicts_total", "Semantic candidates judged by the verifier", ["verdict"]
)
SHADOW_CHECKS = Counter(
    "llmgw_cache_semantic_shadow_total",
    "Sampled semantic hits also answered upstream, by whether the two answers agree",
    ["outcome"],
)
FALSE_HIT_ESTIMATE = Gauge(
    "llmgw_cache_semantic_false_hit_estimate",
    "Share of recent sampled semantic hits whose fresh answer disagreed with the cached one",
    multiprocess_mode="max",
)
FEEDBACK = Counter(
    "llmgw_cache_semantic_feedback_total", "Semantic hits reported wrong (header or admin API)", ["source"]
)

for _label in ("agree", "disagree"):
    SHADOW_CHECKS.labels(_label)  # series exist from the start (rate() and the alert need them)
for _label in ("header", "admin"):
    FEEDBACK.labels(_label)
VERIFIED_OUTCOMES = Counter(
    "llmgw_cache_verified_outcomes_total",
    "Labelled outcomes of semantic candidates in verified mode, by source (explored, shadow, header, admin)",
    ["source", "outcome"],
)
for _source in ("explored", "shadow", "header", "admin"):
    for _outcome in ("right", "wrong"):
        VERIFIED_OUTCOMES.labels(_source, _outcome)  # series from the start, as the shadow checks'
