"""Engine-aware routing against two real `llmgw engine serve` processes (SmolLM2) behind a real gateway.

One client, two groups of prompts that share long prefixes: with nothing queued, engine_score must send
every request of a group to the engine that already holds its prefix, and that engine must report the
prefix as cached (`cached_tokens`) and count it in its vLLM-named prefix-cache metrics.
"""

import argparse
import asyncio
from collections.abc import Iterator

import pytest

from bench.engine_routing import run_strategy, start_engine
from bench.engine_serving import EngineServer

pytestmark = pytest.mark.slow
ARGS = argparse.Namespace(
    device="cpu", dtype="int4", kv_mb=32, threads=1, prefix_tokens=96, groups=2, clients=1, requests=6,
    max_tokens=1, seed=3, batched_tokens=256,
)  # fmt: skip


@pytest.fixture(scope="module")
def engines() -> Iterator[list[EngineServer]]:
    started = [start_engine(ARGS, None) for _ in range(2)]
    yield started
    for engine in started:
        engine.stop()


def test_engine_score_keeps_each_group_on_the_engine_that_caches_its_prefix(
    engines: list[EngineServer],
) -> None:
    row = asyncio.run(run_strategy(ARGS, engines, "engine_score"))
    assert row["requests"] == ARGS.requests
    assert row["group_affinity"] == 1.0, row["split"]
    # 6 requests of 2 groups: at least the 4 repeats find their ~96-token prefix cached (of ~110 tokens)
    assert row["cached_share"] > 0.45, row
    assert row["prefix_hit_rate"] == pytest.approx(row["cached_share"], abs=0.05)  # /metrics agrees
