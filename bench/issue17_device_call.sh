#!/usr/bin/env bash
# Issue 17's next H200 call, in one command: `bash bench/issue17_device_call.sh` (device tool, ~9.5 min).
# 1. the int4_mma kernels' CUDA tests, the fused forms and PDL included (never run on a GPU yet);
# 2. Nsight Compute on one 1-row gate_up launch of today's kernel (what bounds it: DRAM throughput,
#    occupancy, issue slots, stall reasons), where ncu runs (Firecracker machines; not gVisor);
# 3. 8B int4 batch-1 decode per variant (bench/engine_gpu_profile.py: fused = today's default,
#    int4fused, int4pdl, int4both, int4nosplit; fused again for the spread);
# 4. the prefix-cached TTFT at 8B and 1B (bench/engine_gpu.py --only bw,prefix).
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
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 170 python3 -m pytest --noconftest -o addopts="" -q -p no:cacheprovider \
    tests/test_int4_mma.py tests/test_int4_mma_fused.py 2>&1 | tee "$out/int4_tests.log" | tail -25
if command -v ncu >/dev/null; then
    timeout 70 ncu --clock-control none -k regex:int4_mma --launch-skip 2 --launch-count 1 --set full \
        python3 -c "import torch
from backends.local_engine.int4_mma import Int4MmaLinear
layer = Int4MmaLinear(torch.randn(28672, 4096, device='cuda') * 0.02, None, 32)
x = torch.randn(1, 4096, device='cuda').bfloat16()
for _ in range(4):
    layer(x)
torch.cuda.synchronize()" > "$out/int4_ncu_gate_up.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots|Warp Cycles Per Issued" \
        "$out/int4_ncu_gate_up.txt" | head -12
fi
timeout 290 python3 -m bench.engine_gpu_profile --shapes llama-8b --formats int4 \
    --int4-variants fused,int4fused,int4pdl,int4both,int4nosplit,fused --out "$out" 2>&1 \
    | tee "$out/int4_profile.log" | grep -E "tok/s|Error" | tail -12
timeout 95 python3 -m bench.engine_gpu --only bw,prefix --shapes llama-8b,llama-1b --out "$out" 2>&1 \
    | tee "$out/prefix.log" | tail -8
