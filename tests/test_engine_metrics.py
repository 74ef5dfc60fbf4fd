"""The engine server's /metrics against vLLM's production-metrics page (v0.10/v0.11 names): the per-request
histograms (queue, prefill, decode, inference time; prompt and generation tokens; max_tokens and n), tokens
per engine step, vllm:cache_config_info, and time_per_output_token_seconds beside inter_token_latency_seconds;
our own step-time counters (llmgw_engine_step_seconds, llmgw_engine_budget_seconds).
Every series is there before the first request; the values move as requests finish. Fake model (each step
writes one token; a prompt's tokens are its characters)."""

import time
from collections.abc import Iterator

import pytest
from fake_engine_server import fake_load
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from backends.local_engine.server.server import create_app

HISTOGRAMS = [
    "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds", "vllm:iteration_tokens_total", "vllm:request_params_max_tokens",
    "vllm:request_params_n", "vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
]  # fmt: skip


@pytest.fixture
def http() -> Iterator[TestClient]:
    with TestClient(create_app(fake_load)) as client:
        for _ in range(500):
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.01)
        yield client


def _samples(http: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = http.get("/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"model_name": "fake", **labels}.items())))]


def test_every_series_is_there_before_the_first_request(http: TestClient) -> None:
    samples = _samples(http)
    for name in HISTOGRAMS:
        assert _value(samples, f"{name}_count") == 0, name
        assert _value(samples, f"{name}_bucket", le="+Inf") == 0, name
    assert (
        _value(samples, "vllm:request_prompt_tokens_bucket", le="100.0") == 0
    )  # 1-2-5 up to the context (128)
    assert ("vllm:request_prompt_tokens_bucket", (("le", "200.0"), ("model_name", "fake"))) not in samples
    assert _value(samples, "vllm:iteration_tokens_total_bucket", le="16384.0") == 0
    assert _value(samples, "llmgw_engine_step_seconds_total") == 0
    assert _value(samples, "llmgw_engine_budget_seconds_total") == 0
    assert _value(samples, "vllm:request_params_n_bucket", le="20.0") == 0
    for reason in ("stop", "length"):
        assert _value(samples, "vllm:request_success_total", finished_reason=reason) == 0
    info = [labels for (name, labels) in samples if name == "vllm:cache_config_info"]
    assert len(info) == 1
    assert dict(info[0]) == {"block_size": "4", "cache_dtype": "auto", "enable_prefix_caching": "True",
                             "num_gpu_blocks": "64", "num_cpu_blocks": "None", "engine": "0"}  # fmt: skip
    assert samples[("vllm:cache_config_info", info[0])] == 1


def test_the_values_move_as_requests_finish(http: TestClient) -> None:
    def post(endpoint: str, **body) -> None:
        reply = http.post(f"/v1/{endpoint}", json={"model": "fake", "temperature": 0, **body})
        assert reply.status_code == 200, reply.text

    post("completions", prompt="abc", max_tokens=4)  # 1 request: 3 prompt tokens, 4 generated
    post("chat/completions", messages=[{"role": "user", "content": "hello"}], max_tokens=2, n=2)  # 2 x (5, 2)
    post("completions", prompt=["ab", "abcd"], max_tokens=3)  # (2, 3) and (4, 3)
    samples = _samples(http)

    def count_sum(name: str) -> tuple[float, float]:
        return _value(samples, f"{name}_count"), _value(samples, f"{name}_sum")

    assert count_sum("vllm:request_prompt_tokens") == (5, 3 + 5 + 5 + 2 + 4)
    assert count_sum("vllm:request_generation_tokens") == (5, 4 + 2 + 2 + 3 + 3)
    assert _value(samples, "vllm:request_generation_tokens_bucket", le="2.0") == 2
    assert count_sum("vllm:request_params_max_tokens") == (5, 4 + 2 + 2 + 3 + 3)
    assert count_sum("vllm:request_params_n") == (4, 1 + 2 + 1 + 1)  # per prompt
    assert _value(samples, "vllm:request_params_n_bucket", le="1.0") == 3
    # vLLM's iteration tokens: every prompt once (in the step of its first token), every generated token
    assert _value(samples, "vllm:iteration_tokens_total_sum") == 19 + 14
    # the loop's time in steps, and that time weighted by the share of each step's budget it scheduled
    busy, used = (
        _value(samples, "llmgw_engine_step_seconds_total"),
        _value(samples, "llmgw_engine_budget_seconds_total"),
    )
    assert 0 < used < busy
    assert _value(samples, "vllm:request_success_total", finished_reason="length") == 5
    phases = {name: count_sum(f"vllm:request_{name}_time_seconds") for name in
              ("queue", "prefill", "decode", "inference")}  # fmt: skip
    assert all(count == 5 and total >= 0 for count, total in phases.values())
    assert phases["inference"][1] == pytest.approx(phases["prefill"][1] + phases["decode"][1], abs=1e-6)
    assert phases["decode"][1] > 0
    e2e = _value(samples, "vllm:e2e_request_latency_seconds_sum")
    assert e2e >= phases["queue"][1] + phases["inference"][1] - 1e-6
    itl = count_sum("vllm:inter_token_latency_seconds")
    assert itl[0] == 14 - 5 and count_sum("vllm:time_per_output_token_seconds") == itl
