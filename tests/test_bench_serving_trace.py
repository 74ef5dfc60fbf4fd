"""bench/lib/engine_serving_trace.py: the per-step bound, request latencies and goodput, and the profiled breakdown's
attribution of kernels to steps (issue 45's serving benchmark, checked without a GPU)."""

import pytest

from bench.lib.engine_serving_trace import (
    Ceilings,
    ModelCost,
    Request,
    Step,
    _attribute,
    request_metrics,
    trace_metrics,
)

COST = ModelCost(weight_bytes=1000, kv_bytes_per_token=10, layer_params=100, logit_params=50, attn_width=2)
CEIL = Ceilings(bandwidth=1e6, flops=1e6)  # bytes/s, FLOP/s: 1 byte = 1 FLOP = 1 us


def test_a_step_is_bound_by_the_larger_of_its_bytes_and_its_flops() -> None:
    decode = Step(decode_seqs=4, kv_tokens=400, attn_pairs=400, logit_rows=4)
    assert decode.kind == "decode"
    memory, compute = decode.floor_ms(COST, CEIL)
    assert memory == pytest.approx((1000 + 400 * 10) / 1e3)
    assert compute == pytest.approx((2 * 100 * 4 + 2 * 50 * 4 + 4 * 2 * 400) / 1e3)
    prefill = Step(prefill_seqs=1, prefill_tokens=100, kv_tokens=100, attn_pairs=5050, logit_rows=1)
    assert prefill.kind == "prefill" and Step(decode_seqs=1, prefill_tokens=3).kind == "mixed"
    metrics = trace_metrics([decode, prefill], COST, CEIL, wall_s=0.1, output_tokens=5)
    bound = max(decode.floor_ms(COST, CEIL)) + max(prefill.floor_ms(COST, CEIL))
    assert metrics["bound_s"] == pytest.approx(bound / 1e3)
    assert metrics["share_of_bound"] == pytest.approx(bound / 1e3 / 0.1)


def test_ttft_itl_and_goodput() -> None:
    fast = Request([1] * 4, 3, arrival=0.0, token_times=[0.1, 0.2, 0.3])
    slow = Request([1] * 4, 3, arrival=0.0, token_times=[5.0, 5.1, 5.2])
    cut = Request([1] * 4, 3, arrival=0.0, token_times=[0.1])  # did not finish: not good
    metrics = request_metrics([fast, slow, cut], slo_ttft_s=1.0, slo_itl_s=0.5)
    assert metrics["goodput_share"] == pytest.approx(1 / 3)
    assert metrics["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert metrics["itl_ms"]["p99"] == pytest.approx(100.0)


def test_kernels_are_attributed_to_host_step_spans_only() -> None:
    def span(name: str, ts: float, dur: float, cat: str = "user_annotation") -> dict:
        return {"name": name, "cat": cat, "ts": ts, "dur": dur}

    events = [
        span("bench_step", 0, 100), span("bench_step", 0, 100, "gpu_user_annotation"),  # the GPU copy is ignored
        span("bench_model_done", 60, 0),
        span("sm90_xmma_gemm_bf16", 10, 20, "kernel"), span("_paged_attention_kernel", 35, 10, "kernel"),
        span("triton_rms_norm", 50, 5, "kernel"), span("argmax_kernel", 70, 2, "kernel"),
        span("bench_step", 200, 50), span("sm90_gemm", 210, 10, "kernel"),  # no forward: collected tokens only
    ]  # fmt: skip
    parts = _attribute(events, ["decode"])
    assert list(parts) == ["decode"] and parts["decode"]["steps"] == 1
    ms = parts["decode"]["ms_per_step"]
    assert ms["matmul"] == pytest.approx(0.020) and ms["attention"] == pytest.approx(0.010)
    assert ms["other kernels"] == pytest.approx(0.005) and ms["sampling"] == pytest.approx(0.002)
    assert ms["host"] == pytest.approx(0.100 - 0.037)
