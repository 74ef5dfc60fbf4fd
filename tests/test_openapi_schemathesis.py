"""/openapi.json describes every route, and the gateway keeps to it under schemathesis (all phases).

The schemathesis CLI runs against a gateway and a fake upstream served from this process: examples,
coverage, fuzzing and stateful phases, a bounded number of examples per operation and a fixed seed.
It must find no server error and no response that breaks the documented status codes, content types
or schemas (nor a wrong answer to an undeclared method). The admin token is the master key, so one
Authorization header opens both APIs.
"""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.app import create_app
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import FakeUpstream, ServerThread

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
    "response_headers_conformance,unsupported_method,allow_header_conformance"
)


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerThread]:
    with ServerThread(FakeUpstream()) as upstream:
        settings = gateway_settings(upstream.url, admin_token=MASTER_KEY)
        with ServerThread(create_app(settings)) as server:
            yield server


def test_openapi_documents_every_route(gateway: ServerThread) -> None:
    document = httpx.get(gateway.url + "/openapi.json", timeout=30).json()
    paths = document["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        operation = paths[path]["post"]
        assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert {"200", "400", "401", "404", "413", "429", "502", "503"} <= set(operation["responses"])
    assert "/v1/models" in paths and "/metrics" in paths and "/admin/v1/keys/{key_id}" in paths
    for path, item in paths.items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if status[0] in "45" and path != "/health/ready":  # its 503 is the readiness report
                    schema = response["content"]["application/json"]["schema"]
                    shape = "AnthropicError" if path.startswith("/v1/messages") else "Error"
                    assert schema == {"$ref": f"#/components/schemas/{shape}"}, (method, path, status)


def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    gateway: ServerThread, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", gateway.url + "/openapi.json",
        "-H", f"Authorization: Bearer {MASTER_KEY}", "--phases", "examples,coverage,fuzzing,stateful",
        "--checks", CHECKS, "--max-examples", "3", "--seed", "20261202", "--workers", "1", "--no-color",
        "--request-timeout", "30", "--report", "json", "--report-json-path", str(report),
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=480, cwd=tmp_path
    )  # its cache too
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    summary = orjson.loads(report.read_bytes()) if report.exists() else {}
    assert summary == {} or "failures" not in summary or not summary["failures"]
