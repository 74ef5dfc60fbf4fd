"""Proof against a real Prometheus: every dashboard panel and alert rule query runs and returns data.

A gateway (in front of a fake OpenAI upstream and our engine's HTTP server with the engine tests' fake
model) and that engine are scraped every second by Debian's `prometheus` binary, started with a test
variant of deploy/prometheus/prometheus.yml and the real alert rules, while a generated load runs. Every
PromQL expression of deploy/grafana/dashboards/*.json and deploy/prometheus/alerts.yml then goes through
Prometheus's HTTP API: it must parse and return a non-empty result (for alerts: the signal left of the
threshold). Metrics that only another package records while it is not wired into the pipeline yet are
listed in PRODUCED_ELSEWHERE; their expressions must still parse.
"""

import asyncio
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from backends.local_engine.server.server import create_app as create_engine_app
from core.models import DeploymentConfig, ModelConfig
from gateway.app import create_app
from gateway.settings import Settings
from policies.policy import Budget, Limits, Policy
from policies.provision import provision_virtual_key
from routing.config import CascadePolicy, RoutingSettings
from tests.fakes import FakeUpstream, ServerThread, free_port

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KEY = "sk-proof-master"
RATE_INTERVAL, RANGE = "10s", "1m"
# metric or selector → what must record it. Remove an entry once its producer is wired into gateway/services.py.
PRODUCED_ELSEWHERE: dict[str, str] = {}


def find_prometheus() -> str | None:
    return shutil.which("prometheus") or next((p for p in ("/usr/bin/prometheus",) if Path(p).exists()), None)


def settings(upstream_url: str, engine_url: str, database: Path) -> Settings:
    def deployment(name: str, url: str, model: str, price: float) -> DeploymentConfig:
        return DeploymentConfig(name=name, base_url=url + "/v1", model=model, input_price_per_1m=price,
                                output_price_per_1m=2 * price, read_timeout_s=10, connect_timeout_s=1)  # fmt: skip

    models = [
        ModelConfig(
            name="echo", deployments=[deployment("fake-a", upstream_url, "m", 3.0)], fallbacks=["engine"]
        ),
        ModelConfig(name="engine", deployments=[deployment("engine-1", engine_url, "fake", 0.5)]),
        ModelConfig(  # one request at a time: the others wait in the admission queue, some past their deadline
            name="queued",
            deployments=[
                deployment("fake-q", upstream_url, "m", 1.0).model_copy(update={"max_concurrency": 1})
            ],
        ),
        ModelConfig(
            name="broken", deployments=[deployment("nowhere", f"http://127.0.0.1:{free_port()}", "m", 1)]
        ),
    ]
    escalating = CascadePolicy(alias="auto", small="engine", large="echo")  # the fake model is unsure
    kept = CascadePolicy(alias="auto-small", small="engine", large="echo",  # escalate_share: for the gauge;
                         confidence={"threshold": -1e9, "escalate_share": 0.5,  # warm-up all along: kept
                                     "share_window": 1000, "share_warmup": 1000})  # fmt: skip
    capped = CascadePolicy(alias="auto-capped", small="engine", large="echo", max_small_tokens=2)  # cut short
    standard = {"rank": 1, "ttft_s": 2.5, "itl_s": 0.2, "queue_deadline_s": 0.3, "pool_share": 0.95}
    routing = RoutingSettings(
        cascades=[escalating, kept, capped], scrape_interval_s=0.5, health_interval_s=1.0,
        admission={"classes": {"standard": standard}},
    )  # fmt: skip
    values: dict[str, Any] = {"master_key": KEY, "models": models, "routing": routing}
    values["observability"] = {"tenant_label": True}
    values["cache"] = {"defaults": {"semantic": {"mode": "static"}}}  # off by default; the panels need hits
    values["database_url"] = f"sqlite+aiosqlite:///{database}"
    return Settings(**values)


TENANT_POLICY = Policy(tenant_limits=Limits(rpm=20), tenant_budget=Budget(usd_per_day=5.0))
INTERACTIVE_POLICY = Policy(routing={"service_class": "interactive"})
VERIFIED_POLICY = Policy(cache={"semantic": {"mode": "verified"}})  # explored misses label outcomes


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from fake_engine_server import fake_load

    binary = find_prometheus()
    assert binary, "Prometheus is missing: apt-get install -y prometheus"
    with ServerThread(FakeUpstream()) as upstream, ServerThread(create_engine_app(fake_load)) as engine:
        wait_for(f"{engine.url}/health")
        config = settings(upstream.url, engine.url, tmp_path_factory.mktemp("db") / "llmgw.db")
        tenant_key = asyncio.run(provision_virtual_key(config, "acme", TENANT_POLICY))
        chat_key = asyncio.run(provision_virtual_key(config, "chatco", INTERACTIVE_POLICY))
        verified_key = asyncio.run(provision_virtual_key(config, "verico", VERIFIED_POLICY))
        gateway = ServerThread(create_app(config))
        with gateway, prometheus(binary, tmp_path_factory.mktemp("prom"), gateway.port, engine.port) as prom:
            yield {"gateway": gateway.url, "engine": engine.url, "prometheus": prom, "tenant_key": tenant_key,
                   "chat_key": chat_key, "verified_key": verified_key}  # fmt: skip


def wait_for(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


class prometheus:  # noqa: N801 - used as a context manager, like open()
    """Runs Prometheus with the fleet's config rewritten for this test's ports, scraping every second."""

    def __init__(self, binary: str, workdir: Path, gateway_port: int, engine_port: int) -> None:
        self.port = free_port()
        config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        config["rule_files"] = [str(DEPLOY / "prometheus/alerts.yml")]
        targets = {"llmgw": f"127.0.0.1:{gateway_port}", "vllm": f"127.0.0.1:{engine_port}"}
        for job in config["scrape_configs"]:
            job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.command = [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir}/data",
                        f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]  # fmt: skip

    def __enter__(self) -> str:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{self.port}"
        wait_for(f"{url}/-/ready", timeout=30)
        return url

    def __exit__(self, *exc: Any) -> None:
        self.process.terminate()
        self.process.wait(timeout=15)


REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    ("echo", {}, "hello there"),
    ("echo", {"stream": True, "stream_options": {"include_usage": True}}, "slow-stream tell me more"),
    ("engine", {"max_tokens": 8}, "abc"),
    ("engine", {"max_tokens": 8, "stream": True}, "abcabc"),
    ("auto", {"max_tokens": 8}, "abcd"),
    ("auto-small", {"max_tokens": 8}, "abcde"),
    ("auto-capped", {"max_tokens": 8}, "abcdef"),
    ("echo", {}, "fail:500"),  # retried, then served by the fallback alias
    ("queued", {}, "sleep:0.2"),  # three workers, one slot: waits, and refusals past the 0.3 s deadline
    ("broken", {}, "nobody listens"),  # 5xx, and its circuit opens
    ("unknown-model", {}, "x"),
]


# Deterministic questions from a tenant with limits: exact hits, paraphrases (semantic hits), and 429s.
TENANT_REQUESTS = ["What is the capital of France?", "What's the capital of France?"]


def load(gateway: str, keys: dict[str, str], stop: threading.Event) -> None:
    tenant_key, chat_key = keys["tenant_key"], keys["chat_key"]
    with httpx.Client(base_url=gateway, timeout=15) as client:
        while not stop.is_set():
            for model, extra, text in REQUESTS:
                body = {"model": model, "messages": [{"role": "user", "content": text}], **extra}
                client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
            for text in TENANT_REQUESTS:
                body = {"model": "echo", "messages": [{"role": "user", "content": text}], "temperature": 0}
                for key in (tenant_key, keys["verified_key"]):
                    client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
            body = {"model": "queued", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {chat_key}"})
            client.post("/v1/chat/completions", json={"model": "echo", "messages": []})  # 401


@pytest.fixture(scope="module")
def loaded(fleet: dict[str, Any]) -> Iterator[dict[str, Any]]:
    stop = threading.Event()
    workers = [threading.Thread(target=load, args=(fleet["gateway"], fleet, stop)) for _ in range(3)]
    for worker in workers:
        worker.start()
    time.sleep(12)  # several scrapes and rule evaluations with traffic in every rate window
    yield fleet
    stop.set()
    for worker in workers:
        worker.join(30)


def dashboard_queries() -> list[tuple[str, str]]:
    found = []
    for path in sorted((DEPLOY / "grafana/dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            found += [(f"{path.stem}: {panel['title']}", t["expr"]) for t in panel["targets"]]
    return found


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((DEPLOY / "prometheus/alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def signal(expr: str) -> str:
    """`<signal> > 0.05` → `<signal>`: the part that must have data even while the alert is quiet."""
    return re.sub(r"\s*(==|!=|>=|<=|>|<)\s*[0-9.e+-]+\s*$", "", expr.strip())


def query(prometheus_url: str, expr: str) -> dict[str, Any]:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", RANGE)
    return httpx.get(f"{prometheus_url}/api/v1/query", params={"query": expr}, timeout=10).json()


def waived(expr: str) -> bool:
    return any(name in expr for name in PRODUCED_ELSEWHERE)


def test_every_dashboard_query_parses_and_returns_data(loaded: dict[str, Any]) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 30
    empty = []
    for where, expr in queries:
        answer = query(loaded["prometheus"], expr)
        assert answer["status"] == "success", (where, expr, answer)
        if not answer["data"]["result"] and not waived(expr):
            empty.append((where, expr))
    assert not empty, f"queries without data: {empty}"


def test_every_alert_rule_parses_and_its_signal_has_data(loaded: dict[str, Any]) -> None:
    rules = alert_rules()
    assert {"LlmgwHighErrorRate", "LlmgwBackendDown", "LlmgwCircuitOpen", "LlmgwTenantBudgetNearlySpent"} <= {
        r["alert"] for r in rules
    }
    for rule in rules:
        assert query(loaded["prometheus"], rule["expr"])["status"] == "success", rule["alert"]
        answer = query(loaded["prometheus"], signal(rule["expr"]))
        assert answer["status"] == "success" and (answer["data"]["result"] or waived(rule["expr"])), rule[
            "alert"
        ]


def test_prometheus_loaded_and_evaluates_the_rules_without_errors(loaded: dict[str, Any]) -> None:
    groups = httpx.get(f"{loaded['prometheus']}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == len(alert_rules())
    assert all(rule["health"] == "ok" for rule in rules), [(r["name"], r.get("lastError")) for r in rules]
    targets = httpx.get(f"{loaded['prometheus']}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    assert {(t["labels"]["job"], t["health"]) for t in targets} == {("llmgw", "up"), ("vllm", "up")}


def test_the_circuit_opened_and_the_error_rate_alert_fires(loaded: dict[str, Any]) -> None:
    circuit = query(loaded["prometheus"], 'llmgw_deployment_circuit_state{deployment="nowhere"}')
    assert [float(s["value"][1]) for s in circuit["data"]["result"]] in ([2.0], [1.0])
    errors = query(
        loaded["prometheus"],
        signal(next(r for r in alert_rules() if r["alert"] == "LlmgwHighErrorRate")["expr"]),
    )
    assert float(errors["data"]["result"][0]["value"][1]) > 0.05  # one request in eleven goes to `broken`


@pytest.mark.parametrize("check", ["config", "rules"])
def test_promtool_accepts_the_production_files(check: str, tmp_path: Path) -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    files = {"config": DEPLOY / "prometheus/prometheus.yml", "rules": DEPLOY / "prometheus/alerts.yml"}
    done = subprocess.run([promtool, "check", check, str(files[check])], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_verified_mode_and_admission_signals_carry_real_counts(loaded: dict[str, Any]) -> None:
    """Series that exist from the start (zeros) must also move: the verified tenant's explored misses are
    labelled, and the one-slot pool queued and refused requests."""
    for expr in ('sum(llmgw_cache_verified_outcomes_total{source="explored"})',
                 'sum(llmgw_admission_shed_total{model="queued"})',
                 'sum(llmgw_admission_wait_seconds_count{model="queued"})'):  # fmt: skip
        result = query(loaded["prometheus"], expr)["data"]["result"]
        assert result and float(result[0]["value"][1]) > 0, expr
