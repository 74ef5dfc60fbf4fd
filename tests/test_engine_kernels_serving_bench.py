"""`python -m bench.engine_gpu triton --dry-run`: the serving shapes (bench/lib/engine_kernels_serving.py) run on
the CPU through the Triton interpreter, and the engine's paged attention agrees with SDPA on ragged prefill chunks
over cached prefixes (the comparison the GPU run times)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


def test_the_dry_run_prints_ragged_decode_and_prefill_chunks_against_sdpa() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.engine_gpu", "triton", "--dry-run"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert any(line.startswith("decode 3 seqs ctx 20-70") for line in lines)
    prefill = [line for line in lines if line.startswith("dry ragged chunks")]
    assert ["paged_attention (ours)" in prefill[0], "SDPA math" in prefill[1]] == [True, True]
    errors = [float(line.split()[-1]) for line in prefill]
    assert all(error < 2e-2 for error in errors), errors  # bf16 outputs of one computation
