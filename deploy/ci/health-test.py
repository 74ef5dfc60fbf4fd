"""Print a service's compose health check as the argv to exec in its container, one argument per line.

Used by fleet.sh: podman-compose 1.0.3 garbles exec-form (`CMD`) health checks whose arguments hold quotes (the
gateways' and vLLM's `python -c "...urlopen('http://...')"` become `/bin/sh -c python' '-c' ''import ...`), so
fleet.sh runs the test from docker-compose.yml itself with `podman exec`.
    python3 deploy/ci/health-test.py docker-compose.yml gateway-1
"""

import sys

import yaml


def health_argv(compose_file: str, service: str) -> list[str]:
    with open(compose_file) as file:
        test = yaml.safe_load(file)["services"][service]["healthcheck"]["test"]
    if isinstance(test, str):
        return ["/bin/sh", "-c", test]
    kind, *rest = test
    return ["/bin/sh", "-c", rest[0]] if kind == "CMD-SHELL" else rest


if __name__ == "__main__":
    print("\n".join(health_argv(sys.argv[1], sys.argv[2])))
