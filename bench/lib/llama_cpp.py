"""llama.cpp as a measured reference for the engine benchmarks (optional: CI has no llama.cpp).

`llama-server` is started the way issue 14 quotes it (`-np 16 -t 2`) and driven by bench/engine_serving.py's
own client, the same OpenAI-style streamed requests it sends to `llmgw engine serve` (llama-server reads
`max_tokens`, `ignore_eos` and `temperature` 0 = greedy from the same body). `llama-bench` gives its
in-process decode speed. How to build both: studies/README.md ("llama.cpp beside the engine").
"""

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_SLOTS = 16  # llama-server -np: parallel sequences (issue 14's setting)
SERVER_THREADS = 2


@dataclass(frozen=True)
class LlamaCpp:
    """Paths of a llama.cpp build and the GGUF it runs."""

    server: Path
    model: Path

    @property
    def bench(self) -> Path:
        """llama-bench, built next to llama-server."""
        return self.server.with_name("llama-bench")

    @staticmethod
    def env() -> dict[str, str]:
        """The environment without the engine's OpenMP settings (threads.configure_openmp, set in this process
        before its in-process runs): PASSIVE makes ggml's OpenMP threads sleep at every barrier (llama-bench -t 2:
        27 vs 77 tok/s); llama.cpp runs with its own defaults."""
        return {
            key: value
            for key, value in os.environ.items()
            if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
        }

    def server_command(self, port: int) -> list[str]:
        return [
            str(self.server), "-m", str(self.model), "-np", str(SERVER_SLOTS), "-t", str(SERVER_THREADS),
            "--host", "127.0.0.1", "--port", str(port), "--no-webui",
        ]  # fmt: skip


def llama_bench_decode(llama: LlamaCpp, threads: int, tokens: int = 64) -> dict:
    """`llama-bench -m GGUF -t THREADS -p 0 -n TOKENS`: decode tok/s (mean and stddev over its 5 repetitions)."""
    command = [str(llama.bench), "-m", str(llama.model), "-t", str(threads), "-p", "0", "-n", str(tokens)]
    report = subprocess.run(
        [*command, "-o", "json"], capture_output=True, text=True, check=True, env=llama.env()
    )
    (test,) = json.loads(report.stdout)
    return {
        "command": " ".join(command),
        "threads": threads,
        "decode_tok_s": test["avg_ts"],
        "stddev_tok_s": test["stddev_ts"],
        "build": test.get("build_commit"),
        "model_type": test.get("model_type"),
        "load": os.getloadavg()[0],
    }
