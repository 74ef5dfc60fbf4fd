#!/usr/bin/env bash
# CI only: make the gateway image's base (Debian bookworm + Python 3.11, what python:3.11-slim is) from
# Debian's packages with mmdebstrap and import it into podman, as no container registry is reachable here.
# The host's CA bundle goes in (and pip is told to use it): this machine's HTTPS goes through a proxy whose
# CA only that bundle carries. The production Dockerfile keeps its public default base (python:3.11-slim).
#   deploy/ci/build-base.sh [IMAGE]      (default localhost/llmgw-base:bookworm; kept if it exists)
set -euo pipefail
image="${1:-localhost/llmgw-base:bookworm}"
if podman image exists "$image"; then echo "base image $image exists"; exit 0; fi
command -v mmdebstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq mmdebstrap >/dev/null; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-venv,python-is-python3,ca-certificates,passwd \
  --customize-hook='cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"' \
  --customize-hook='printf "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n" > "$1/etc/pip.conf"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm "$work/base.tar" http://deb.debian.org/debian
podman import --change 'CMD ["python3"]' "$work/base.tar" "$image" >/dev/null
echo "built base image $image"
