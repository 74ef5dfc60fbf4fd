"""The provisioned Grafana dashboards: valid JSON models Grafana imports unchanged, datasource by uid."""

import importlib.util
import json
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana/dashboards").glob("*.json"))


def builder():  # noqa: ANN201 - the module built from deploy/grafana/build_dashboards.py
    spec = importlib.util.spec_from_file_location("build_dashboards", DEPLOY / "grafana/build_dashboards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_dashboards_are_what_the_builder_writes() -> None:
    assert {p.name: p.read_text() for p in DASHBOARDS} == builder().render_all()


def test_five_dashboards_with_unique_uids_covering_the_issues() -> None:
    models = [json.loads(p.read_text()) for p in DASHBOARDS]
    assert sorted(m["uid"] for m in models) == [
        "llmgw-backends",
        "llmgw-cost",
        "llmgw-limits",
        "llmgw-overload",
        "llmgw-overview",
    ]
    titles = " | ".join(panel["title"] for m in models for panel in m["panels"])
    for needed in ("Requests per second", "Error rate", "latency", "Time to first token", "Gateway overhead",
                   "Cost per 1k tokens", "Cache hit rate", "Cascade", "KV-cache", "Prefix-cache", "Preemptions",
                   "Rejections by limit kind", "budget burn", "waiting for a slot", "Refused by admission",
                   "SLO attainment (goodput) by class", "fair shares"):  # fmt: skip
        assert needed in titles, needed


def test_every_panel_uses_the_provisioned_datasource_by_uid_and_fits_the_grid() -> None:
    provisioned = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    for path in DASHBOARDS:
        model = json.loads(path.read_text())
        assert isinstance(model["schemaVersion"], int) and model["title"] and "id" not in model
        ids = [panel["id"] for panel in model["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for panel in model["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": uid}
            assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
            assert panel["targets"] and all(
                t["datasource"]["uid"] == uid and t["expr"] for t in panel["targets"]
            )
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_dashboard_provider_points_where_compose_mounts_the_dashboards() -> None:
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/llmgw.yml").read_text())
    compose = (DEPLOY.parent / "docker-compose.yml").read_text()
    path = provider["providers"][0]["options"]["path"]
    assert f"./deploy/grafana/dashboards:{path}:ro" in compose
