#!/usr/bin/env bash
# CI: a CycloneDX SBOM of each lock the image uses, and a vulnerability audit of every lock.
#   build/sbom/llmgw-<lock>.cdx.json     (cyclonedx-py requirements, from build/ci-tools)
# The audit (pip-audit --no-deps --disable-pip -r <lock>, OSV by default: AUDIT_SERVICE=osv|pypi, AUDIT_OSV_URL
# for a mirror of the OSV API) fails on any known advisory. A package that could not be audited (the service
# unreachable) fails too, unless AUDIT_REQUIRED=0, which turns that into a loud warning: this CI machine
# reaches neither api.osv.dev nor PyPI's per-version JSON API (deploy/README.md, "Supply chain").
set -euo pipefail
cd "$(dirname "$0")/../.."
tools=build/ci-tools/bin
mkdir -p build/sbom
for lock in runtime semantic; do
  "$tools/cyclonedx-py" requirements "requirements/$lock.txt" --pyproject pyproject.toml --of JSON \
    --output-reproducible -o "build/sbom/llmgw-$lock.cdx.json"
done
echo "SBOM: $(ls build/sbom/*.cdx.json | tr '\n' ' ')"
service=(-s "${AUDIT_SERVICE:-osv}")
[ -n "${AUDIT_OSV_URL:-}" ] && service+=(--osv-url "$AUDIT_OSV_URL")
status=0
for lock in runtime semantic engine tracing dev; do
  report="build/sbom/audit-$lock.json"
  rm -f "$report"
  if ! "$tools/pip-audit" "${service[@]}" --no-deps --disable-pip -r "requirements/$lock.txt" -f json \
      -o "$report" --progress-spinner off 2>build/sbom/audit-$lock.log && [ ! -s "$report" ]; then
    echo "${AUDIT_REQUIRED:-1}" | grep -q 1 && { echo "AUDIT FAILED TO RUN $lock:"; status=1; } \
      || echo "WARNING, audit could not run for $lock:"
    tail -n 1 "build/sbom/audit-$lock.log"
    continue
  fi
  "$tools/python" - "$report" "$lock" "${AUDIT_REQUIRED:-1}" <<'PY' || status=1
import json, sys
report, lock, required = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3] == "1"
deps = report["dependencies"]
found = [(d["name"], d["version"], v["id"]) for d in deps for v in d.get("vulns", [])]
skipped = [d["name"] for d in deps if d.get("skip_reason")]
for name, version, vuln in found:
    print(f"VULNERABLE {lock}: {name}=={version} {vuln}")
if skipped:
    print(f"{'NOT AUDITED' if required else 'WARNING, not audited'} {lock}: {len(skipped)} of {len(deps)} "
          f"packages (advisory service unreachable?)")
print(f"audit {lock}: {len(deps) - len(skipped)} audited, {len(found)} known vulnerabilities")
sys.exit(1 if found or (skipped and required) else 0)
PY
done
exit "$status"
