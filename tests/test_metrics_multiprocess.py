"""Several workers: with PROMETHEUS_MULTIPROC_DIR set, /metrics adds up every worker's samples."""

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
WORKER = """
import asyncio
from core.context import Reply, RequestContext, Usage
from gateway.observe import create_observability
from gateway.pipeline import chain
from gateway.settings import Settings

obs = create_observability(Settings())

async def answer(ctx, _next):
    ctx.deployment, ctx.usage = "local-smollm2", Usage(7, 3)
    return Reply(body={})

ctx = RequestContext("r", "chat", {}, {}, "smollm2")
asyncio.run(chain([obs.stage, answer])(ctx))
obs.metrics.in_flight.labels("smollm2").inc()  # this worker still has one request running
"""
RENDER = "from gateway.observe import create_observability; from gateway.settings import Settings; " \
         "import sys; sys.stdout.write(create_observability(Settings()).render()[0].decode())"  # fmt: skip


def python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_two_workers_counters_and_live_gauges_are_summed(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for _ in range(2):
        python(WORKER, env)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(python(RENDER, env))
        for s in family.samples
    }
    requests = [v for (name, labels), v in samples.items() if name == "llmgw_requests_total"]
    tokens = [v for (name, labels), v in samples.items() if name == "llmgw_tokens_total"]
    assert requests == [2.0] and sorted(tokens) == [6.0, 14.0]
    assert samples[("llmgw_requests_in_flight", (("model", "smollm2"),))] == 2.0
