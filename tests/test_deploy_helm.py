"""The Helm chart (deploy/helm/llmgw): linted, rendered, validated against the Kubernetes API schemas offline
(kubernetes-validate carries them), and its migration Job and drain settings checked.

helm and kubernetes-validate come from deploy/ci/tools.sh (build/ci-tools; .ci/run runs it). No cluster
runs here: nothing is applied; see deploy/README.md, "Kubernetes".
"""

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy/helm/llmgw"
FLEET = CHART / "ci/fleet-values.yaml"
TOOLS = ROOT / "build/ci-tools/bin"


def tool(name: str) -> str | None:
    local = TOOLS / name
    return str(local) if local.exists() else shutil.which(name)


HELM, VALIDATE = tool("helm"), tool("kubernetes-validate")
pytestmark = pytest.mark.skipif(HELM is None or VALIDATE is None,
                                reason="helm or kubernetes-validate missing: run deploy/ci/tools.sh")  # fmt: skip


def render(*args: str) -> list[dict[str, Any]]:
    out = subprocess.run([HELM, "template", "llmgw", str(CHART), "--namespace", "ai", *args],  # type: ignore[list-item]
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def default_render(*args: str) -> list[dict[str, Any]]:
    return render("--set", "secrets.masterKey=sk-test", *args)


def one(docs: list[dict[str, Any]], kind: str, name: str = "llmgw") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [(d["kind"], d["metadata"]["name"]) for d in docs])
    return found[0]


def container(docs: list[dict[str, Any]], kind: str = "Deployment", name: str = "llmgw") -> dict[str, Any]:
    return one(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]


def env(spec: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in spec["env"]}


def test_chart_lints_strictly() -> None:
    for values in ([], ["-f", str(FLEET)]):
        lint = subprocess.run([HELM, "lint", "--strict", str(CHART), "--set", "secrets.masterKey=x", *values],  # type: ignore[list-item]
                              capture_output=True, text=True)  # fmt: skip
        assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("values", [[], ["-f", str(FLEET)]], ids=["defaults", "fleet"])
def test_rendered_manifests_validate_against_the_kubernetes_schemas(
    tmp_path: Path, values: list[str]
) -> None:
    docs = default_render(*values)
    builtin = [d for d in docs if d["apiVersion"] != "monitoring.coreos.com/v1"]
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(yaml.safe_dump_all(builtin))
    result = subprocess.run([VALIDATE, "--strict", "--kubernetes-version", "1.33.0", str(manifest)],  # type: ignore[list-item]
                            capture_output=True, text=True)  # fmt: skip
    report = result.stdout + result.stderr
    assert result.returncode == 0 and "ERROR" not in report and "WARN" not in report, report
    assert report.count("passed for resource") == len(builtin)
    # ServiceMonitor: the Prometheus Operator's CRD schema is not available offline; its shape is checked here.
    service = one(docs, "Service")
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert (
        monitors
        and monitors[0]["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()
    )
    assert monitors[0]["spec"]["endpoints"][0] | {"interval": None} == {"port": "http", "path": "/metrics",
                                                                         "interval": None}  # fmt: skip
    assert {p["name"] for p in service["spec"]["ports"]} == {"http"}


def test_schema_validation_catches_a_broken_manifest(tmp_path: Path) -> None:
    deployment = one(default_render(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = ["http"]
    deployment["spec"]["replicaz"] = 3
    manifest = tmp_path / "broken.yaml"
    manifest.write_text(yaml.safe_dump(deployment))
    result = subprocess.run([VALIDATE, "--strict", str(manifest)], capture_output=True, text=True)  # type: ignore[list-item]
    assert result.returncode != 0


def test_migration_job_runs_before_the_pods_idempotently_and_the_gateway_never_migrates() -> None:
    docs = default_render()
    job = one(docs, "Job", "llmgw-migrate")
    hooks = job["metadata"]["annotations"]
    assert hooks["helm.sh/hook"] == "pre-install,pre-upgrade"  # before the Deployment is applied
    assert "before-hook-creation" in hooks["helm.sh/hook-delete-policy"]
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never" and spec["containers"][0]["command"] == ["llmgw", "migrate"]
    assert job["spec"]["backoffLimit"] >= 1 and job["spec"]["activeDeadlineSeconds"] > 0
    for kind, name in (("Secret", "llmgw-secrets"), ("ConfigMap", "llmgw-config")):  # what the Job reads
        weight = int(one(docs, kind, name)["metadata"]["annotations"]["helm.sh/hook-weight"])
        assert weight < int(hooks["helm.sh/hook-weight"])
    assert env(container(docs))["LLMGW_POLICIES__AUTO_MIGRATE"] == "false"
    assert env(spec["containers"][0]) == env(container(docs))
    assert not [d for d in render("--set", "secrets.masterKey=x", "--set", "migration.enabled=false")
                if d["kind"] == "Job"]  # fmt: skip


@pytest.mark.parametrize("grace", [None, 120])
def test_drain_finishes_inside_the_termination_grace_period(grace: int | None) -> None:
    docs = default_render(*(["--set", f"drain.shutdownGraceSeconds={grace}"] if grace else []))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    gateway = pod["containers"][0]
    grace_s = float(env(gateway)["LLMGW_SHUTDOWN_GRACE_S"])
    assert grace_s == (grace or Settings.model_fields["shutdown_grace_s"].default)
    sleep_s = int(gateway["lifecycle"]["preStop"]["exec"]["command"][1])
    assert sleep_s >= 1
    # preStop sleep, then SIGTERM: the gateway's grace period, then uvicorn's 5 s backstop (gateway/cli.py)
    assert pod["terminationGracePeriodSeconds"] > sleep_s + grace_s + 5
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert one(docs, "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_pods_run_as_the_image_user_on_a_read_only_root() -> None:
    docs = default_render()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
    assert "--uid 10001" in (ROOT / "Dockerfile").read_text()
    security = pod["containers"][0]["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"/tmp", "/var/lib/llmgw"} <= mounts
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert one(docs, "HorizontalPodAutoscaler")["spec"]["minReplicas"] >= 2


def test_fleet_values_route_to_engine_pools_and_the_config_loads(tmp_path: Path, monkeypatch: Any) -> None:
    docs = default_render("-f", str(FLEET))
    config = tmp_path / "gateway.yaml"
    config.write_text(one(docs, "ConfigMap", "llmgw-config")["data"]["gateway.yaml"])
    for name in [n for n in os.environ if n.startswith("LLMGW_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LLMGW_CONFIG_FILE", str(config))
    settings = load_settings()
    assert [m.name for m in settings.models] == ["small", "large"]
    assert settings.routing.engine_pools == ["small", "large"]
    assert settings.models[0].deployments[0].base_url == "http://llmgw-engine-small:8000/v1"
    one(docs, "Service", "llmgw-engine-small")
    assert one(docs, "Deployment", "llmgw-engine-large")["spec"]["template"]["spec"]["containers"][0]["image"]
    mounts = {m["mountPath"] for m in container(docs)["volumeMounts"]}
    assert "/etc/llmgw/tls" in mounts
    assert one(docs, "Secret", "llmgw-secrets")["stringData"]["redisUrl"].startswith("rediss://")
