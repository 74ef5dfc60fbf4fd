#!/usr/bin/env bash
# Issue 17's next GPU call, in one command: `LIMIT=<seconds> bash studies/issue17_device_call.sh` (device tool,
# ~5 min; ask for kind nvidia-h200: the targets are H200 figures, and the H100 already meets the int4 one).
# 1. the int4_mma CUDA tests (the one-LOP3 dequantization has run on an H100 only);
# 2. the official table: bench/engine_gpu.py --only bw,decode,prefix at 8B and 1B.
# Logs and JSON land in $OUT (or bench/results when run by hand); the last lines are the table.
# The device image has no pydantic (the engine's settings need it): first, here,
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection
# and name `.whl` in the call's carry (it is git-ignored, so it travels only when carried).
set -u
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
out=${OUT:-bench/results}
limit=${LIMIT:-585}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 200 python3 -m pytest --noconftest -o addopts="" -q -p no:cacheprovider tests/test_int4_mma.py \
    tests/test_int4_mma_fused.py 2>&1 | tee "$out/int4_tests.log" | tail -5
timeout $((limit - SECONDS)) python3 -m bench.engine_gpu --only bw,decode,prefix --shapes llama-8b,llama-1b \
    --out "$out" 2>&1 | tee "$out/decode.log" | tail -16
