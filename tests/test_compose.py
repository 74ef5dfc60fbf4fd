"""The deployment files: docker-compose.yml against the Compose Specification schema, and consistency of the
fleet (replicas behind the load balancer, GPU reservations, health checks, scrape targets, .env.example)."""

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "tests/data/compose-spec/compose-spec.json"
VARIABLE = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def env_example() -> dict[str, str]:
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, rest = line.partition("=")
            values[name.strip()] = rest.split(" #")[0].strip()
    return values


def interpolate(node: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution (${VAR}, ${VAR:-default}, ${VAR:?error}), as done before validation."""
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, env) for value in node]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match[str]) -> str:
        name, operator, argument = match.groups()
        value = env.get(name, "")
        if operator and operator.endswith("?") and not value:
            raise KeyError(f"{name}: {argument}")
        return value if value or not operator else argument

    return VARIABLE.sub(substitute, node)


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return interpolate(raw, env_example() if env is None else env)


def validator() -> jsonschema.Draft201909Validator:
    """The schema names draft 2019-09 (by a URL jsonschema does not know, hence explicitly)."""
    return jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))


def test_compose_file_validates_against_the_compose_specification() -> None:
    errors = sorted(validator().iter_errors(compose()), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_schema_check_catches_a_broken_file() -> None:
    broken = compose()
    broken["services"]["redis"]["healthcheck"]["retries"] = "many"
    broken["services"]["lb"]["portz"] = ["8000:8080"]
    assert len(list(validator().iter_errors(broken))) >= 2


def test_secrets_are_required_not_defaulted() -> None:
    env = {k: v for k, v in env_example().items() if k != "LLMGW_MASTER_KEY"}
    with pytest.raises(KeyError, match="LLMGW_MASTER_KEY"):
        compose(env)


def test_fleet_shape_two_gateways_behind_nginx_and_two_vllm_servers_on_gpus() -> None:
    services = compose()["services"]
    nginx = (ROOT / "deploy/nginx/nginx.conf").read_text()
    assert {"gateway-1", "gateway-2"} <= set(services)
    assert "server gateway-1:8000" in nginx and "server gateway-2:8000" in nginx
    for name in ("vllm-small", "vllm-large"):
        vllm = services[name]
        assert vllm["image"].startswith("vllm/vllm-openai")
        assert "--enable-prefix-caching" in vllm["command"]
        [device] = vllm["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"]
    assert services["migrate"]["command"] == ["llmgw", "migrate"]
    assert services["gateway-1"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_every_long_running_service_has_a_health_check_and_dependencies_exist() -> None:
    services = compose()["services"]
    for name, service in services.items():
        if name != "migrate":
            assert service["healthcheck"]["test"], name
        assert set(service.get("depends_on", {})) <= set(services), name


def test_published_ports_bind_loopback_by_default() -> None:
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)


def test_mounted_files_exist_and_prometheus_scrapes_the_compose_services() -> None:
    services = compose()["services"]
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = {t.split(":")[0] for job in prometheus["scrape_configs"] for c in job["static_configs"]
               for t in c["targets"]}  # fmt: skip
    assert targets == {"gateway-1", "gateway-2", "vllm-small", "vllm-large"}


def test_every_variable_the_compose_file_uses_is_documented_in_env_example() -> None:
    used = set(VARIABLE.findall((ROOT / "docker-compose.yml").read_text()))
    documented = env_example()
    assert {name for name, _, _ in used} <= set(documented)


def test_dockerfile_is_multi_stage_non_root_and_serves_on_all_interfaces() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert (
        dockerfile.count("\nFROM ") + dockerfile.startswith("FROM ") >= 2
        and "COPY --from=build" in dockerfile
    )
    assert re.search(r"^USER llmgw$", dockerfile, re.M)
    assert 'CMD ["llmgw", "serve", "--host", "0.0.0.0"]' in dockerfile
