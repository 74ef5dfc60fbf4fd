#!/usr/bin/env bash
# Issue 17's next GPU call, in one command: `bash bench/issue17_device_call.sh` (device tool, ~9 min).
# 1. the int4_mma CUDA tests, the streamed kernel (configs 5-8) included, then the fused-form tests with every
#    1-8 row call on config 5;
# 2. the kernels alone: each launch shape per 8B projection at 1 and 8 rows (bench.engine_gpu_int4_kernels);
# 3. 8B int4 batch-1 decode per variant (bench/engine_gpu_profile.py: fused = today's default, int4s5..int4s8
#    = the streamed kernel's configs);
# 4. the fastest of those with SwiGLU and residual adds in the epilogues (LLMGW_INT4_FUSED=2), then, with the
#    time left, the official decode table (bench/engine_gpu.py --only bw,decode) at 8B and 1B with the fastest.
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
timeout 200 python3 -m pytest --noconftest -o addopts="" -q -p no:cacheprovider tests/test_int4_mma.py 2>&1 \
    | tee "$out/int4_tests.log" | tail -15
LLMGW_INT4_MMA_CONFIGS="*:5" timeout 60 python3 -m pytest --noconftest -o addopts="" -q -p no:cacheprovider \
    tests/test_int4_mma_fused.py 2>&1 | tee -a "$out/int4_tests.log" | tail -5
timeout 90 python3 -m bench.engine_gpu_int4_kernels --kinds mma --rows 1 --configs --out "$out" 2>&1 \
    | tee "$out/int4_kernels.log" | tail -6
timeout 260 python3 -m bench.engine_gpu_profile --shapes llama-8b --formats int4 \
    --int4-variants fused,int4s5,int4s6,int4s7,int4s8 --out "$out" 2>&1 \
    | tee "$out/int4_profile.log" | grep -E "tok/s|Error|error" | tail -8
best=$(python3 - "$out/engine_gpu_profile.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
streamed = {k: r["decode_tok_s"] for k, r in rows.items() if "int4s" in k and "decode_tok_s" in r}
print(max(streamed, key=streamed.get).rsplit("int4s", 1)[1] if streamed else "")
PY
)
echo "fastest streamed config: ${best:-none}"
[ -n "$best" ] || exit 0
# the same config with SwiGLU and residual adds in the epilogues (LLMGW_INT4_FUSED=2)
mkdir -p "$out/e"
timeout 80 python3 -m bench.engine_gpu_profile --shapes llama-8b --formats int4 --int4-variants "int4s${best}e" \
    --out "$out/e" 2>&1 | tee -a "$out/int4_profile.log" | grep -E "tok/s|Error|error" | tail -3
fused=$(python3 - "$out/engine_gpu_profile.json" "$out/e/engine_gpu_profile.json" <<'PY'
import json, sys
plain = max(r.get("decode_tok_s", 0) for k, r in json.load(open(sys.argv[1]))["rows"].items() if "int4s" in k)
epi = max([r.get("decode_tok_s", 0) for r in json.load(open(sys.argv[2]))["rows"].values()] or [0])
print(2 if epi > plain else 0)
PY
)
left=$((${LIMIT:-585} - SECONDS))
echo "official table: LLMGW_INT4_MMA_CONFIGS=*:$best LLMGW_INT4_FUSED=$fused; ${left} s left"
if [ "$left" -gt 60 ]; then
    LLMGW_INT4_MMA_CONFIGS="*:$best" LLMGW_INT4_FUSED="$fused" timeout "$left" python3 -m bench.engine_gpu \
        --only bw,decode --shapes llama-8b,llama-1b --out "$out" 2>&1 | tee "$out/decode.log" | tail -14
fi
