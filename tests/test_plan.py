"""Issue 43: `llmgw plan`'s arithmetic; the seed's 70B worked numbers exactly."""

import json
from pathlib import Path

from gateway.cli import main
from routing.planning.capacity import (
    GB,
    GIB,
    Measured,
    ModelShape,
    StepModel,
    Workload,
    gpus_for,
    plan,
    sequences_fit,
    ttft_p90_s,
)

LLAMA_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False}  # fmt: skip


def test_seed_70b_numbers() -> None:
    shape = ModelShape(
        layers=80, kv_heads=8, head_dim=128, kv_dtype_bytes=2, params=70e9, weight_dtype_bytes=2
    )
    assert shape.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680 == 320 * 1024  # 320 KiB
    per_sequence = shape.kv_bytes_per_token * 8192
    assert per_sequence == 2.5 * GIB
    # four 80 GB GPUs less 140 GB of fp16 weights leave 180 GB: 67 sequences of 8,192 tokens
    assert shape.weight_bytes == 140 * GB
    assert sequences_fit(4 * 80 * GB, shape.weight_bytes, shape.kv_bytes_per_token, 8192) == 67
    assert 3.99 < gpus_for(shape.weight_bytes, per_sequence, 67, 80 * GB) <= 4.0  # and they take the 4 GPUs


def test_shape_from_hf_config() -> None:
    shape = ModelShape.from_hf_config(LLAMA_70B, dtype="fp16")
    assert shape.kv_bytes_per_token == 327_680
    assert 70.0e9 < shape.params < 71.0e9  # Llama-3-70B: 70.6 B


def test_plan_limits_and_replicas() -> None:
    shape = ModelShape.from_hf_config(LLAMA_70B, dtype="fp16")
    steps = StepModel(base_s=0.03, per_kv_byte_s=1 / 2.3e12, prefill_s_per_token=0.0002)
    light = Workload(
        rate_per_s=1.0, input_mean=2000, output_mean=300, input_p90=4000, ttft_slo_s=2.0, itl_slo_s=0.1
    )
    one = plan(shape, 80 * GB, steps, light, gpus_per_replica=4)
    assert one.sequences_fit > 0 and 1 <= one.batch <= one.sequences_fit
    assert one.decode_step_s <= 0.1 and one.max_rate_per_replica > 0
    heavy = Workload(**{**light.__dict__, "rate_per_s": one.max_rate_per_replica * 3.5})
    assert plan(shape, 80 * GB, steps, heavy, gpus_per_replica=4).replicas == 4
    tight = Workload(**{**light.__dict__, "itl_slo_s": 0.035})
    assert plan(shape, 80 * GB, steps, tight, gpus_per_replica=4).limited_by == "itl_slo"
    slow = plan(shape, 80 * GB, StepModel(0.03, 1 / 2.3e12, 0.001), light, gpus_per_replica=4)
    assert slow.max_rate_per_replica == 0 and slow.replicas == 0 and slow.notes  # 4,000 tokens x 1 ms > 2 s
    cached = Workload(**{**light.__dict__, "hit_rate": 0.5})
    assert plan(shape, 80 * GB, steps, cached, 4).max_rate_per_replica > one.max_rate_per_replica


def test_measured_unit_sets_the_queueing() -> None:
    """A unit measured on the workload (closed-loop rate, unloaded p90 TTFT) replaces the step model's
    service time: the answer is the M/G/1 rate where p90 TTFT reaches the SLO, whatever the step model says."""
    shape = ModelShape.from_hf_config(LLAMA_70B, dtype="fp16")
    light = Workload(
        rate_per_s=5.0, input_mean=2000, output_mean=300, input_p90=4000, ttft_slo_s=2.0, itl_slo_s=0.1
    )
    fast, slow = StepModel(0.03, 1 / 2.3e12, 1e-5), StepModel(0.03, 1 / 2.3e12, 1e-4)
    unit = Measured(requests_per_s=3.5, ttft_p90_s=0.78)
    a = plan(shape, 80 * GB, fast, light, 4, measured=unit)
    b = plan(shape, 80 * GB, slow, light, 4, measured=unit)
    assert a.max_rate_per_replica == b.max_rate_per_replica and a.replicas == b.replicas == 3
    busy = 1 / 3.5
    work = {"busy_s": busy, "busy2_s": 1.5 * busy * busy, "step_s": 0.0, "prefill_p90_s": 0.78}
    assert abs(ttft_p90_s(a.max_rate_per_replica, work) - 2.0) < 1e-6  # the rate where p90 TTFT meets the SLO
    assert 0.7 < a.max_rate_per_replica / 3.5 < 0.72  # rho/(1-rho) = (2 - 0.78) / (ln 10 * 0.75 * busy)
    without = plan(shape, 80 * GB, fast, light, 4, measured=Measured(3.5))
    assert without.max_rate_per_replica > a.max_rate_per_replica  # the step model's p90 prefill is 0.04 s
    assert plan(shape, 80 * GB, fast, light, 4, measured=Measured(3.5, 2.5)).replicas == 0  # misses unloaded


def test_cli_plan_prints_json(tmp_path: Path, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_70B))
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 1000, "input_length": 1000, "output_length": 10, "hash_ids": [1, 3]}\n')  # fmt: skip
    args = ["plan", "--config", str(config), "--dtype", "fp16", "--gpu", "H100", "--gpus-per-replica", "4",
            "--trace", str(trace), "--sequence-tokens", "8192", "--gpu-memory-gb", "80"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["kv_bytes_per_token"] == 327_680
    assert out["workload"]["rate_per_s"] == 2.0 and out["workload"]["hit_rate"] == 512 / 2000
    assert out["plan"]["replicas"] >= 1
