"""The gateway that cache_latency, semantic_cache_replay and `semantic_cache_eval http` measure.

One alias (`bench-model`) in front of a fake upstream, an empty SQLite database, no access log, the semantic
cache in static mode (it is off by default; the gateway's environment overrides it), the master key; and a
chat completion's body of one user message.
"""

import tempfile
from typing import Any

from bench.lib.harness import Process

KEY = "sk-bench-master"
MODEL = "bench-model"


def body(question: str, temperature: float) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "temperature": temperature}


def config(upstream: Process) -> dict[str, Any]:
    deployment = {"name": "fake", "base_url": upstream.url + "/v1", "model": "upstream-model"}
    database = f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='llmgw-bench-')}/llmgw.db"
    return {"master_key": KEY, "models": [{"name": MODEL, "deployments": [deployment]}], "database_url": database,
            "observability": {"access_log": False},
            "cache": {"defaults": {"semantic": {"mode": "static"}}}}  # fmt: skip  # off by default; env overrides
