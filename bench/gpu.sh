#!/bin/sh
# The engine's GPU benchmarks on a machine whose Python has torch, triton and transformers but not the
# project's other needs (the lent GPU: /work/.library/device/README.md).
#   here:   bench/gpu.sh wheels            downloads those wheels (pinned in requirements/) into .whl/ (ignored)
#   there:  bench/gpu.sh python3 -m bench.engine_serving_gpu ...   installs .whl/*.whl into /tmp/site, runs it
# One-liner on the device (carry .whl): bench/gpu.sh python3 -m bench.engine_serving_gpu --shapes llama-8b
set -e
if [ "$1" = wheels ]; then
  pins=$(grep -hoE '^(pydantic|pydantic-core|annotated-types|typing-inspection|typing-extensions|orjson|gguf)==[^ ]+' \
    requirements/runtime.txt requirements/engine.txt | sort -u)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $pins
  exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec "$@"
