#!/usr/bin/env bash
# Issue 17's next GPU call, in one command: `LIMIT=<seconds> bash bench/issue17_device_call.sh` (device tool).
# Steps in order of need; each runs only if the time left (LIMIT, default 585 s) allows it:
# 1. the int4_mma CUDA tests, the streamed kernel (configs 5-8) included, then the fused-form tests with every
#    1-8 row call on config 5;
# 2. 8B int4 batch-1 decode per variant (bench/engine_gpu_profile.py): fused = today's default, int4s5 and
#    int4s7 = the streamed kernel (16 consumer warps, 32 or 16 steps a copy), then int4s6 / int4s8;
# 3. the fastest streamed config with SwiGLU and residual adds in the epilogues (LLMGW_INT4_FUSED=2);
# 4. the kernels alone per 8B projection and launch shape at 1 row (bench.engine_gpu_int4_kernels);
# 5. the official decode table (bench/engine_gpu.py --only bw,decode) at 8B and 1B with the fastest.
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
left() { echo $((limit - SECONDS)); }
best_of() {  # the fastest int4s<N> row of a profile JSON: N, or nothing
    python3 - "$1" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
streamed = {k: r["decode_tok_s"] for k, r in rows.items() if "int4s" in k and "decode_tok_s" in r}
print(max(streamed, key=streamed.get).rsplit("int4s", 1)[1] if streamed else "")
PY
}
profile() {  # variants, out dir, seconds
    mkdir -p "$2"
    timeout "$3" python3 -m bench.engine_gpu_profile --shapes llama-8b --formats int4 --int4-variants "$1" \
        --out "$2" 2>&1 | tee -a "$out/int4_profile.log" | grep -E "tok/s|Error|error" | tail -6
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout $(( $(left) / 2 )) python3 -m pytest --noconftest -o addopts="" -q -p no:cacheprovider tests/test_int4_mma.py \
    2>&1 | tee "$out/int4_tests.log" | tail -12
LLMGW_INT4_MMA_CONFIGS="*:5" timeout 60 python3 -m pytest --noconftest -o addopts="" -q -p no:cacheprovider \
    tests/test_int4_mma_fused.py 2>&1 | tee -a "$out/int4_tests.log" | tail -3
[ "$(left)" -gt 100 ] && profile fused,int4s5,int4s7 "$out" $(( $(left) - 20 ))
[ "$(left)" -gt 100 ] && profile int4s6,int4s8 "$out/b" $(( $(left) - 20 ))
best=$(best_of "$out/engine_gpu_profile.json")
echo "fastest streamed config (5 or 7): ${best:-none}; $(left) s left"
[ -n "$best" ] || exit 0
[ "$(left)" -gt 70 ] && profile "int4s${best}e" "$out/e" $(( $(left) - 10 ))
[ "$(left)" -gt 90 ] && timeout $(( $(left) - 60 )) python3 -m bench.engine_gpu_int4_kernels --kinds mma --rows 1 \
    --configs --out "$out" 2>&1 | tee -a "$out/int4_profile.log" | tail -6
if [ "$(left)" -gt 80 ]; then
    LLMGW_INT4_MMA_CONFIGS="*:$best" timeout $(( $(left) - 5 )) python3 -m bench.engine_gpu --only bw,decode \
        --shapes llama-8b,llama-1b --out "$out" 2>&1 | tee "$out/decode.log" | tail -14
fi
echo "done, $(left) s left"
