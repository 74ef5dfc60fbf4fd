#!/bin/sh
# The engine's GPU benchmarks on a machine whose Python has torch, triton and transformers but not the
# project's other needs (the lent GPU: /work/.library/device/README.md).
#   here:   bench/gpu.sh wheels            downloads those wheels (pinned in requirements/) into .whl/ (ignored)
#           bench/gpu.sh wheels pool       also the gateway's and AIPerf's (bench/trace_replay.py and
#                                          bench/admission_replay.py on a GPU pool: the gateway, the engines and
#                                          AIPerf all on the device host), less what the device's image holds
#                                          and copies the traces and the tokenizer the pool runs need into .gpu/
#   there:  bench/gpu.sh python3 -m bench.engine_serving_gpu ...   installs .whl/*.whl into /tmp/site, runs it
#           bench/gpu.sh pool trace_replay|admission_replay ARGS    the same, with the GPU pool's fixed arguments
#                                          first (4 engines of the Llama-3 1B shape on one card, 8000 MiB KV each,
#                                          2,048-token steps, full-length traces from .gpu/traces, AIPerf there);
#                                          later ARGS override them (e.g. --replicas 1 --kv-mb 40000)
# One-liner on the device (carry .whl): bench/gpu.sh python3 -m bench.engine_serving_gpu --shapes llama-8b
set -e
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d .whl "$@"
}
if [ "$1" = wheels ]; then
  names='pydantic|pydantic-core|annotated-types|typing-inspection|typing-extensions|orjson|gguf'
  # the gateway's runtime that the device's image lacks (its list: /work/.library/device/KINDS.md)
  [ "$2" = pool ] && names="$names|aiosqlite|alembic|fastapi|greenlet|hiredis|httptools|llguidance"\
"|mako|opentelemetry-api|pydantic-settings|python-dotenv|redis|sqlalchemy|starlette|uvicorn|watchfiles|websockets"
  download $(grep -hoE "^($names)==[^ ]+" requirements/runtime.txt requirements/engine.txt | sort -u)
  # AIPerf (pyproject's `trace` extra) and what it imports for `profile` that the image lacks; its plotting,
  # Kubernetes and dataset-hub extras are left out (`aiperf profile` runs without them: checked in a venv here)
  [ "$2" = pool ] && download aiperf==0.13.0 brotli==1.2.1 cffi==2.1.1 crick==0.0.8 cyclopts==4.25.3 \
    docstring_parser==0.18.0 importlib_metadata==10.2.0 ffmpeg-python==0.2.0 future==1.0.0 jmespath==1.0.1 lazy-importer==0.1.0 \
    msgspec==0.23.0 platformdirs==4.14.9 pycparser==3.12 python-json-logger==4.2.0 python-multipart==0.0.34 \
    pytz==2026.6 pyzmq==26.4.0 rich-rst==2.2.0 ruamel.yaml==0.18.17 ruamel.yaml.clib==0.2.15 \
    setproctitle==1.3.8 starlette-compress==2.0.0 tzdata==2026.6 zstandard==0.25.0
  if [ "$2" = pool ]; then  # what the pool runs read there: carry .whl, .gpu and build/hf-cache
    mkdir -p .gpu/traces && cp ../shared/traces/*.csv ../shared/traces/*.jsonl .gpu/traces/
    .venv/bin/python -m bench.lib.trace_aiperf >/dev/null  # the tokenizer into build/hf-cache
  fi
  exit 0
fi
if [ "$1" = pool ]; then
  bench=$2
  shift 2
  set -- python3 -m "bench.$bench" --device cuda --dtype bf16 --random-shape llama-1b \
    --tokenizer-dir build/hf-cache/models--HuggingFaceTB--SmolLM2-135M/snapshots/llmgw-gguf \
    --traces-dir .gpu/traces --aiperf "python3 -m aiperf" --replicas 4 --kv-mb 8000 --batched-tokens 2048 \
    --length-div 1 --max-input 32768 "$@"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec "$@"
