#!/usr/bin/env bash
# Regenerate the hashed locks in requirements/ (uv pip compile, CPython 3.11 on x86_64 Linux, manylinux_2_28):
#   runtime.txt   the gateway's runtime dependencies             (Dockerfile with EXTRAS=, the CI image)
#   semantic.txt  runtime + semantic extra, torch 2.13.0+cpu     (Dockerfile default, EXTRAS=semantic)
#   engine.txt    runtime + engine extra, torch 2.13.0+cpu
#   tracing.txt   runtime + tracing extra
#   dev.txt       runtime + engine + semantic + dev              (what .ci/run installs before the tests)
#   build.txt     setuptools and wheel, the build backend
# The gpu extra (vllm) is not locked: vLLM runs in its own image (docker-compose.yml), never in ours.
# torch+cpu comes from PyTorch's CPU index; TORCH_FIND_LINKS may name a folder holding that wheel instead
# (offline machines). Needs uv (pip install uv).
#   deploy/ci/lock.sh            (UV=path/to/uv to choose the binary)
set -euo pipefail
cd "$(dirname "$0")/../.."
uv="${UV:-uv}"
torch_source=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
if [ -n "${TORCH_FIND_LINKS:-}" ]; then torch_source=(--find-links "$TORCH_FIND_LINKS" --no-emit-find-links); fi
compile() {
  local out="$1"; shift
  "$uv" pip compile --quiet --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --index-url https://pypi.org/simple --no-emit-index-url --custom-compile-command deploy/ci/lock.sh \
    "$@" -o "requirements/$out"
}
compile build.txt requirements/build.in
compile runtime.txt pyproject.toml
for extra in semantic engine tracing; do
  compile "$extra.txt" pyproject.toml --extra "$extra" "${torch_source[@]}" --override requirements/torch-cpu.in
done
compile dev.txt pyproject.toml --extra engine --extra semantic --extra dev "${torch_source[@]}" \
  --override requirements/torch-cpu.in
