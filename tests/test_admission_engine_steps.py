"""bench/admission_replay.py's engine-step figures: the counters it scrapes and what it makes of them."""

import re

from bench.lib.admission_pool import engine_window
from bench.lib.admission_report import against_engine, targets
from bench.lib.engine_http import COUNTER

METRICS = """# HELP vllm:iteration_tokens_total Tokens per engine step.
vllm:iteration_tokens_total_bucket{le="2048.0",model_name="m"} 10.0
vllm:iteration_tokens_total_count{model_name="m"} 10.0
vllm:iteration_tokens_total_sum{model_name="m"} 12288.0
vllm:num_requests_running{model_name="m"} 3.0
vllm:num_requests_waiting{model_name="m"} 1.0
vllm:kv_cache_usage_perc{model_name="m"} 0.5
vllm:prompt_tokens_total{model_name="m"} 900.0
llmgw_engine_step_seconds_total{model_name="m"} 12.5
llmgw_engine_budget_seconds_total{model_name="m"} 7.25
"""


def test_the_counter_pattern_reads_step_count_and_sum_but_not_buckets() -> None:
    found = {m[1]: float(m[2]) for m in re.finditer(COUNTER, METRICS, re.M)}
    assert found == {
        "vllm:iteration_tokens_total_count": 10.0,
        "vllm:iteration_tokens_total_sum": 12288.0,
        "vllm:num_requests_running": 3.0,
        "vllm:num_requests_waiting": 1.0,
        "vllm:kv_cache_usage_perc": 0.5,
        "vllm:prompt_tokens_total": 900.0,
        "llmgw_engine_step_seconds_total": 12.5,
        "llmgw_engine_budget_seconds_total": 7.25,
    }


def _sample(t: float, steps: float, tokens: float, running: float, waiting: float) -> dict[str, float]:
    return {"t": t, "vllm:iteration_tokens_total_count": steps, "vllm:iteration_tokens_total_sum": tokens,
            "vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting,
            "vllm:kv_cache_usage_perc": running / 5}  # fmt: skip


def test_engine_window_counts_only_samples_inside_the_window() -> None:
    seen = [_sample(0, 0, 0, 9, 9), _sample(10, 100, 102_400, 4, 2), _sample(12, 160, 163_840, 6, 0),
            _sample(14, 200, 184_320, 8, 4), _sample(30, 900, 900_000, 9, 9)]  # fmt: skip
    steps = engine_window(seen, (5.0, 20.0), budget=2048, engines=2)
    assert steps["steps_per_s"] == 100 / 4 / 2
    assert steps["tokens_per_s"] == 81_920 / 4
    assert steps["tokens_per_step"] == 819.2
    assert steps["step_fill"] == 0.4
    assert steps["running_mean"] == 6.0 and steps["waiting_mean"] == 2.0
    assert steps["kv_usage_mean"] == 1.2 / 2  # two engines' usages summed, then averaged


def test_engine_window_gives_time_shares_from_our_engines_step_counters() -> None:
    seen = [{**_sample(0, 0, 0, 4, 1), "llmgw_engine_step_seconds_total": 1.0, "llmgw_engine_budget_seconds_total": 0.5},
            {**_sample(10, 100, 102_400, 4, 1), "llmgw_engine_step_seconds_total": 19.0,
             "llmgw_engine_budget_seconds_total": 15.5}]  # fmt: skip
    steps = engine_window(seen, (0.0, 10.0), budget=2048, engines=2)
    assert steps["busy"] == 18 / 10 / 2 and steps["budget_use"] == 15 / 10 / 2
    assert "busy" not in engine_window([_sample(0, 0, 0, 1, 0), _sample(5, 9, 90, 1, 0)], (0.0, 9.0), 2048, 1)


def test_engine_window_is_empty_with_fewer_than_two_samples() -> None:
    assert engine_window([_sample(0, 0, 0, 0, 0)], (0.0, 1.0), budget=2048, engines=1) == {}


def _case(fill: float, engine_tok_s: float) -> dict:
    return {"interactive": {"served_tok_s": 20_000.0}, "batch": {"served_tok_s": 27_000.0},
            "engine_steps": {"step_fill": fill, "tokens_per_s": engine_tok_s}}  # fmt: skip


def test_against_engine_is_the_batch_over_what_the_engines_computed_beyond_the_interactive_tenant() -> None:
    assert against_engine(_case(0.99, 50_000.0)) == 0.9
    assert against_engine({**_case(0.99, 50_000.0), "engine_steps": {}}) is None
    assert (
        against_engine(_case(0.99, 15_000.0)) is None
    )  # the interactive tenant alone exceeds it: no yardstick


def test_the_pool_full_target_needs_full_steps_as_well_as_the_share() -> None:
    def verdict(case: dict) -> bool | None:
        case = {**case, "p95_vs_alone": 1.0, "batch_vs_remaining": 0.5}
        for tenant in ("interactive", "batch"):
            case[tenant] = {**case[tenant], "goodput": 1.0, "refused": {}, "timeouts": 0}
        found = targets({"priority": {"mixed": {"fair": case}}})["priority/fair"]
        return found["pool_full_and_batch_vs_engine_left>=0.9"]

    assert verdict(_case(0.99, 50_000.0)) is True
    assert verdict(_case(0.60, 50_000.0)) is False  # steps part empty: the pool was left idle
    kv_full = _case(0.60, 50_000.0)
    kv_full["engine_steps"]["kv_usage_mean"] = 0.93
    assert verdict(kv_full) is True  # part-empty steps, but no memory for another sequence
    assert verdict(_case(0.99, 60_000.0)) is False  # 0.675 of what was left
    assert verdict({**_case(0.99, 50_000.0), "engine_steps": {}}) is None
    by_time = _case(0.60, 50_000.0)  # iteration tokens look part empty; the budget used over time says full
    by_time["engine_steps"]["budget_use"] = 0.93
    assert verdict(by_time) is True
    by_time["engine_steps"] = {**by_time["engine_steps"], "budget_use": 0.5, "step_fill": 0.99}
    assert verdict(by_time) is False  # the time-weighted figure wins where the engines report it
