"""`llmgw plan` beside llm-d-planner (PyPI `llm-d-planner` 0.3.3) on the same inputs (issue 43).

llm-d-planner fetches a model's config and safetensors sizes from the HF Hub, which this machine cannot
reach: its config is given here as the Llama-3-70B config.json fields and its weight size as the same
140 GB both planners are told (its `model_memory_req` replaced by that constant). Everything else is its
own code: KVCacheDetail (KV bytes per token), allocatable_kv_cache_memory (memory × utilisation × GPUs less
weights, a measured activation peak and NCCL/non-torch overhead) and max_concurrent_requests.

Run it in the venv that holds llm-d-planner (its pins stay out of the project's .venv):
    python3 -m venv build/planner-venv && build/planner-venv/bin/pip install llm-d-planner==0.3.3
    build/planner-venv/bin/python -m studies.trace_plan_compare     # writes studies/results/plan_compare.json
"""

import json
from pathlib import Path
from types import SimpleNamespace

from routing.planning.capacity import GB, GIB, ModelShape, sequences_fit

LLAMA3_70B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
              "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": 128256, "torch_dtype": "float16", "max_position_embeddings": 8192,
              "tie_word_embeddings": False}  # fmt: skip
WEIGHTS = 140 * GB
RESULTS = Path(__file__).resolve().parent / "results" / "plan_compare.json"


def theirs(gpu_gib: float, tp: int, util: float, context: int) -> dict:
    from planner import capacity_planner as cp

    config = SimpleNamespace(**LLAMA3_70B)
    cp.model_memory_req = lambda *args, **kwargs: WEIGHTS / GIB  # offline: the same weights as ours
    detail = cp.KVCacheDetail("llama-3-70b", config, context, 1)
    kv_gib = cp.allocatable_kv_cache_memory("llama-3-70b", config, gpu_gib, util, tp, 1, 1, context)
    return {
        "kv_bytes_per_token": detail.per_token_memory_bytes,
        "kv_memory_gib": kv_gib,
        "sequences": cp.max_concurrent_requests("llama-3-70b", config, context, gpu_gib, util, 1, tp, 1, 1),
        "activation_gib": cp.estimate_vllm_activation_memory(config, tp),
        "non_torch_gib_per_gpu": cp.estimate_vllm_non_torch_memory(tp, 1),
    }


def ours(gpu_bytes: float, gpus: int, util: float, context: int) -> dict:
    shape = ModelShape.from_hf_config(LLAMA3_70B, dtype="fp16")
    shape = ModelShape(shape.layers, shape.kv_heads, shape.head_dim, 2.0, WEIGHTS / 2, 2.0)
    left = gpu_bytes * gpus * util - WEIGHTS
    return {"kv_bytes_per_token": shape.kv_bytes_per_token, "kv_memory_gib": left / GIB,
            "sequences": sequences_fit(gpu_bytes * gpus, WEIGHTS, shape.kv_bytes_per_token, context, util)}  # fmt: skip


def main() -> None:
    rows = []
    for label, gpu_gib, util in [("seed: 4 x 80 GB, all memory", 80 * GB / GIB, 1.0),
                                  ("4 x 80 GiB (H100), utilisation 0.9", 80.0, 0.9),
                                  ("4 x 141 GB (H200), utilisation 0.9", 141 * GB / GIB, 0.9)]:  # fmt: skip
        rows.append(
            {
                "case": label,
                "ours": ours(gpu_gib * GIB, 4, util, 8192),
                "llm_d_planner": theirs(gpu_gib, 4, util, 8192),
            }
        )
    for row in rows:
        o, t = row["ours"], row["llm_d_planner"]
        print(f"{row['case']:<38} ours: {o['kv_bytes_per_token']} B/token, {o['kv_memory_gib']:.1f} GiB KV, "
              f"{o['sequences']} seq | llm-d-planner: {t['kv_bytes_per_token']} B/token, {t['kv_memory_gib']:.1f} GiB KV, "
              f"{t['sequences']} seq (activation {t['activation_gib']} GiB, non-torch {t['non_torch_gib_per_gpu']} GiB/GPU)")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
