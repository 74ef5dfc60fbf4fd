#!/usr/bin/env bash
# CI only: the compose fleet (docker-compose.yml + deploy/ci/compose.ci.yml) on podman, with podman-compose.
#   deploy/ci/fleet.sh up       build the images (fleet-images.sh), start the fleet, wait for its health checks
#   deploy/ci/fleet.sh down     remove its containers, network and volumes
#   deploy/ci/fleet.sh compose ARGS...   podman-compose with the fleet's files, project and environment
#   deploy/ci/fleet.sh healthy SERVICE [TIMEOUT_S]   wait for a service's health check
# podman-compose 1.0.3 (Debian bookworm) does not wait for `depends_on` conditions, podman runs no health checks
# without systemd, and podman-compose garbles exec-form checks with quotes (health-test.py), so `up` starts the
# services in the order the conditions give and runs each service's check from docker-compose.yml with
# `podman exec` until it passes: PostgreSQL and Redis healthy ->
# migrate exited 0 -> engines started, gateways healthy -> nginx and Prometheus healthy. Grafana is not started.
# podman here needs runc and explicit ulimits (deploy/README.md): they go in a containers.conf (CONTAINERS_CONF).
# Ports on 127.0.0.1: nginx $LLMGW_PORT (18080), Prometheus $PROMETHEUS_PORT (19090). Secrets default to CI values.
set -euo pipefail
cd "$(dirname "$0")/../.."
project="${FLEET_PROJECT:-llmgw-ci}"
export LLMGW_PORT="${LLMGW_PORT:-18080}" PROMETHEUS_PORT="${PROMETHEUS_PORT:-19090}"
export LLMGW_MASTER_KEY="${LLMGW_MASTER_KEY:-sk-llmgw-fleet-ci}" LLMGW_ADMIN_TOKEN="${LLMGW_ADMIN_TOKEN:-fleet-ci-admin}"
export POSTGRES_PASSWORD="${POSTGRES_PASSWORD:-fleet-ci-pg}" GRAFANA_ADMIN_PASSWORD="${GRAFANA_ADMIN_PASSWORD:-unused}"
mkdir -p build/ci-fleet
nofile="$(ulimit -Hn)"; nproc="$(ulimit -Hu)"
[ "$nofile" = unlimited ] && nofile=1048576
[ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768  # podman lowers its own nproc to 32768
runtime=""; command -v runc >/dev/null && runtime='runtime = "runc"'  # crun refuses hybrid cgroups here
printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n[engine]\n%s\n' \
  "$nofile" "$nofile" "$nproc" "$nproc" "$runtime" > build/ci-fleet/containers.conf
export CONTAINERS_CONF="$PWD/build/ci-fleet/containers.conf"
log=build/ci-fleet/compose.log

compose() { podman-compose -p "$project" -f docker-compose.yml -f deploy/ci/compose.ci.yml "$@"; }

healthy() {  # SERVICE TIMEOUT_S: run the service's own health check (docker-compose.yml's) until it passes
  local name="${project}_$1_1" deadline=$((SECONDS + $2)) test
  mapfile -t test < <(python3 deploy/ci/health-test.py docker-compose.yml "$1")
  until podman exec "$name" "${test[@]}" >/dev/null 2>&1; do
    if [ "$(podman inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != true ] || ((SECONDS > deadline)); then
      echo "$1 is not healthy after $2 s; its last output:" >&2; podman logs --tail 40 "$name" >&2 || true
      return 1
    fi
    sleep 1
  done
  echo "$1 healthy"
}

up() {  # SERVICES...: start them (podman-compose also re-runs their dependencies: already running, kept)
  compose up -d --no-build "$@" >>"$log" 2>&1 || { tail -30 "$log" >&2; return 1; }
}

case "${1:-}" in
  up)
    command -v podman-compose >/dev/null || { apt-get update -qq && apt-get install -y -qq podman-compose >/dev/null; }
    deploy/ci/fleet-images.sh
    : >"$log"
    "$0" down >/dev/null 2>&1 || true
    up postgres redis
    healthy postgres 60; healthy redis 30
    up migrate
    status="$(podman wait "${project}_migrate_1")"
    [ "$status" = 0 ] || { echo "migrate exited $status" >&2; podman logs "${project}_migrate_1" >&2; exit 1; }
    echo "migrate exited 0"
    up vllm-small vllm-large gateway-1 gateway-2
    healthy gateway-1 120; healthy gateway-2 60
    up lb prometheus
    healthy lb 30; healthy prometheus 60
    ;;
  down)
    # containers with their anonymous volumes (the gateways' /var/lib/llmgw), then named volumes and the network
    podman ps -aq --filter "label=io.podman.compose.project=$project" | xargs -r podman rm -f -v -t 5 >/dev/null
    compose down -v >>"$log" 2>&1 || true
    podman volume ls -q --filter "label=io.podman.compose.project=$project" | xargs -r podman volume rm -f >/dev/null
    podman network rm -f "${project}_default" >/dev/null 2>&1 || true
    ;;
  healthy) healthy "$2" "${3:-60}" ;;
  compose) shift; compose "$@" ;;
  *) echo "usage: $0 up|down|healthy SERVICE [TIMEOUT_S]|compose ARGS" >&2; exit 2 ;;
esac
