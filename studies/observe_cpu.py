"""CPU cost of the observe stage (metrics + access log) per request, measured in-process.

Runs the same pipeline (stages with no work of their own, a backend answering at once) with and without
ObserveStage, alternating runs, and reports the extra CPU microseconds per request for a
JSON answer and for a 50-chunk stream. The access log writes to /dev/null through the real logger.
Compare with the gateway's total CPU per request (bench/gateway_overhead.py): the issue's budget is 10 %.

    python studies/observe_cpu.py [--requests 20000] [--rounds 5]
"""

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry  # noqa: E402

from core.context import Principal, Reply, RequestContext, Usage  # noqa: E402
from core.models import DeploymentConfig, ModelConfig  # noqa: E402
from gateway.access_log import AccessLog  # noqa: E402
from gateway.metrics import GatewayMetrics  # noqa: E402
from gateway.observability_config import ObservabilitySettings  # noqa: E402
from gateway.observe import ObserveStage  # noqa: E402
from gateway.pipeline import chain  # noqa: E402
from gateway.settings import Settings  # noqa: E402

CHUNK = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "tok"}}]}


async def backend(ctx: RequestContext, _next: Any) -> Reply:
    ctx.deployment, ctx.usage, ctx.cost_usd = "d1", Usage(20, 50), 0.0001
    if not ctx.stream:
        return Reply(body={"choices": [{"index": 0, "message": {"content": "x"}}]})

    async def chunks():
        for _ in range(50):
            yield CHUNK

    return Reply(stream=chunks())


def pipeline(observed: bool) -> Any:
    settings = Settings(
        models=[
            ModelConfig(name="m", deployments=[DeploymentConfig(name="d1", base_url="http://x", model="m")])
        ]
    )
    logger = logging.getLogger("bench.access")
    logger.handlers = [logging.StreamHandler(open(os.devnull, "w"))]  # noqa: SIM115
    logger.setLevel(logging.INFO)
    logger.propagate = False
    metrics = GatewayMetrics.from_settings(settings, CollectorRegistry())
    stage = ObserveStage(metrics, AccessLog(ObservabilitySettings(), logger))
    stages = [stage, backend] if observed else [backend]
    return chain(stages)


async def drive(handler: Any, requests: int, stream: bool) -> float:
    started = time.process_time()
    for i in range(requests):
        ctx = RequestContext(str(i), "chat", {}, {}, "m", stream=stream, started_at=time.perf_counter())
        ctx.principal = Principal("tenant", "key", "sk-abc")
        reply = await handler(ctx)
        if reply.stream is not None:
            async for _ in reply.stream:
                pass
    return (time.process_time() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    for stream in (False, True):
        kind = "stream_50_chunks" if stream else "json"
        results[kind] = {"plain": [], "observed": []}
        for _ in range(args.rounds):  # alternate, so noise from other processes hits both alike
            for observed in (False, True):
                us = asyncio.run(drive(pipeline(observed), args.requests, stream))
                results[kind]["observed" if observed else "plain"].append(us)
    print(f"{'answer':<18}{'plain us/req':>14}{'observed us/req':>17}{'observe cost us':>17}")
    summary = {}
    for kind, runs in results.items():
        plain, observed = min(runs["plain"]), min(runs["observed"])
        summary[kind] = {"plain_us": plain, "observed_us": observed, "observe_cost_us": observed - plain}
        print(f"{kind:<18}{plain:>14.1f}{observed:>17.1f}{observed - plain:>17.1f}")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "observe_cpu.json").write_text(json.dumps({"runs": results, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
