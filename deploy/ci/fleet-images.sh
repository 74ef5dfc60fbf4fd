#!/usr/bin/env bash
# CI only: build every image of the compose fleet here (no registry is reachable), for deploy/ci/compose.ci.yml.
#   localhost/llmgw:ci                 the real Dockerfile, EXTRAS= (runtime lock)    -> gateway-1/2, migrate
#   localhost/llmgw-engine:ci          engine lock (torch CPU) + SmolLM2 + vLLM's CLI, with the project and runtime
#                                      packages of localhost/llmgw:ci (images/engine.Containerfile) -> vllm-small/large
#   localhost/llmgw-ci-{nginx,redis,postgres,prometheus}:bookworm   Debian's packages (images/*.Containerfile)
# All on the Debian bookworm base of build-base.sh. podman's layer cache keeps rebuilds to seconds; the Debian
# service images are kept once built (FLEET_REBUILD=1 rebuilds them). torch comes from /opt/wheels where that
# exists (served to the build as a package index on 127.0.0.1), else from PyTorch's CPU index.
set -euo pipefail
cd "$(dirname "$0")/../.."
base="${LLMGW_BASE_IMAGE:-localhost/llmgw-base:bookworm}"
deploy/ci/build-base.sh "$base"
nofile="$(ulimit -Hn)"; nproc="$(ulimit -Hu)"
[ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768  # podman lowers its own nproc to 32768
[ "$nofile" = unlimited ] && nofile=1048576
runtime=(); command -v runc >/dev/null && runtime=(--runtime runc)  # crun refuses hybrid cgroups here
build() { podman "${runtime[@]}" build -q --pull=never --format docker --ulimit "nofile=$nofile:$nofile" \
            --ulimit "nproc=$nproc:$nproc" --build-arg "BASE=$base" "$@" >/dev/null; }
for service in nginx redis postgres prometheus; do
  image="localhost/llmgw-ci-$service:bookworm"
  if [ -z "${FLEET_REBUILD:-}" ] && podman image exists "$image"; then continue; fi
  build -f "deploy/ci/images/$service.Containerfile" -t "$image" deploy/ci/images
  echo "built $image"
done
build --build-arg EXTRAS= -t localhost/llmgw:ci .
echo "built localhost/llmgw:ci"
context="$(mktemp -d)"; index="$(mktemp -d)"; server=""
trap 'rm -rf "$context" "$index"; [ -z "$server" ] || kill "$server"' EXIT
cp requirements/engine.txt deploy/ci/images/engine-model.txt deploy/ci/images/vllm-serve.py "$context/"
torch=()
if ls /opt/wheels/torch-*.whl >/dev/null 2>&1; then
  mkdir "$index/torch"; ln -s /opt/wheels/torch-*.whl "$index/torch/"
  port="${FLEET_WHEEL_PORT:-18099}"  # fixed: TORCH_INDEX is part of the layer's cache key
  python3 -m http.server -d "$index" -b 127.0.0.1 "$port" >/dev/null 2>&1 & server=$!
  torch=(--network host --build-arg "TORCH_INDEX=http://127.0.0.1:$port/")
fi
build -f deploy/ci/images/engine.Containerfile "${torch[@]}" -t localhost/llmgw-engine:ci "$context"
echo "built localhost/llmgw-engine:ci"
