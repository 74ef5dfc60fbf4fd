"""How PyTorch thread settings hold up when another process keeps a core busy (SmolLM2-135M shapes).

Each configuration runs in a fresh process (OMP_WAIT_POLICY is read when torch starts), alternating
configurations run by run, with and without a busy-looping neighbour process.

    .venv/bin/python -m bench.engine_threads [--repeats 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench.harness import RESULTS

CONFIGS = [
    {"threads": 1, "wait_policy": None},
    {"threads": 2, "wait_policy": None},
    {"threads": 2, "wait_policy": "PASSIVE"},
    {"threads": 1, "wait_policy": "PASSIVE"},
]

WORKER = """
import time, torch, sys
from transformers import LlamaConfig, LlamaForCausalLM
torch.set_num_threads(int(sys.argv[1]))
config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)
model = LlamaForCausalLM(config).eval()
decode = torch.randint(0, 49152, (16, 1))
prefill = torch.randint(0, 49152, (1, 256))
def timed(ids, n):
    with torch.inference_mode():
        model(ids)
        start = time.perf_counter()
        for _ in range(n):
            model(ids)
    return (time.perf_counter() - start) / n
print(timed(decode, 20), timed(prefill, 5))
"""


def run(config: dict, busy: bool) -> tuple[float, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if config["wait_policy"]:
        env["OMP_WAIT_POLICY"] = config["wait_policy"]
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        out = subprocess.run([sys.executable, "-c", WORKER, str(config["threads"])], env=env, check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
    finally:
        if neighbour:
            neighbour.kill()
            neighbour.wait()
    decode, prefill = map(float, out.split())
    return decode, prefill


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    samples: dict[tuple, list[tuple[float, float]]] = {}
    for repeat in range(args.repeats):
        for config in CONFIGS if repeat % 2 == 0 else list(reversed(CONFIGS)):
            for busy in (False, True):
                key = (config["threads"], config["wait_policy"] or "default", busy)
                samples.setdefault(key, []).append(run(config, busy))
                time.sleep(0.5)
    print(
        f"{'threads':>7} {'OMP_WAIT_POLICY':>15} {'neighbour':>9} {'decode b16 ms':>13} {'prefill 256 ms':>14}"
    )
    rows = []
    for (threads, policy, busy), values in sorted(samples.items()):
        decode = statistics.median(v[0] for v in values) * 1000
        prefill = statistics.median(v[1] for v in values) * 1000
        print(f"{threads:>7} {policy:>15} {'busy' if busy else 'idle':>9} {decode:>13.1f} {prefill:>14.1f}")
        rows.append({"threads": threads, "wait_policy": policy, "busy_neighbour": busy, "decode_ms": decode,
                     "prefill_ms": prefill})  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "engine_threads.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
