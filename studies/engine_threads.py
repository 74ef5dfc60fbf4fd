"""How PyTorch thread settings hold up when another process keeps a core busy (SmolLM2-135M linear layers).

Each configuration runs in a fresh process (OMP_WAIT_POLICY is read when torch starts), alternating
configurations run by run, with and without a busy-looping neighbour process.

    .venv/bin/python -m studies.engine_threads [--repeats 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from studies import RESULTS

CONFIGS = [
    {"threads": 1, "wait_policy": None},
    {"threads": 2, "wait_policy": None},
    {"threads": 2, "wait_policy": "PASSIVE"},
    {"threads": 1, "wait_policy": "PASSIVE"},
]

WORKER = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
# the linear layers of SmolLM2-135M (30 layers: q, k, v, o, gate, up, down) plus the LM head
layers = [[torch.randn(i, o) * 0.02 for i, o in ((576, 576), (576, 192), (576, 192), (576, 576),
           (576, 1536), (576, 1536), (1536, 576))] for _ in range(30)]
head = torch.randn(576, 49152) * 0.02
def forward(x):
    for wq, wk, wv, wo, wg, wu, wd in layers:
        q, k, v = x @ wq, x @ wk, x @ wv
        x = x + q @ wo
        x = x + ((x @ wg) * (x @ wu)) @ wd
    return x @ head
def timed(rows, n):
    x = torch.randn(rows, 576)
    forward(x)
    start = time.perf_counter()
    for _ in range(n):
        forward(x)
    return (time.perf_counter() - start) / n
print(timed(16, 10), timed(256, 3))
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
                print(key, samples[key][-1], flush=True)
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
