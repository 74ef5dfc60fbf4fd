#!/bin/sh
# The engine's GPU benchmarks on a machine whose Python has torch, triton and transformers but not the
# project's other needs (the lent GPU: /work/.library/device/README.md).
#   here:   bench/gpu.sh wheels            downloads those wheels (pinned in requirements/) into .whl/ (ignored)
#           bench/gpu.sh wheels pool       also the gateway's and AIPerf's (bench/trace_replay.py and
#                                          bench/admission_replay.py on a GPU pool: the gateway, the engines and
#                                          AIPerf all on the device host), less what the device's image holds
#   there:  bench/gpu.sh python3 -m bench.engine_serving_gpu ...   installs .whl/*.whl into /tmp/site, runs it
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
  exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec "$@"
