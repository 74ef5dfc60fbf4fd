"""CPU per request of the whole stage list in-process, before vs after: source trees run in turn.

Each run starts the services of one tree (master key, in-process stores, metrics and access log on),
replaces the deployment's HTTP calls by an instant answer (a JSON body, or a 50-chunk stream with a usage
chunk), and times `services.handler` plus reading the stream. No sockets: what is left is the pipeline
itself, so the stream rows show the per-chunk cost of the end-of-reply machinery. Runs alternate between
the trees; the minimum of the rounds is reported (the least disturbed run on a shared box). Python function
calls per request (cProfile, 200 requests) are exact whatever the load.

    PYTHONPATH=. .venv/bin/python bench/pipeline_cpu.py /tmp/before . --rounds 5
"""

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ANSWER = {"id": "x", "object": "chat.completion", "usage": {"prompt_tokens": 5, "completion_tokens": 2},
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}  # fmt: skip
CHUNKS = [{"id": "x", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]} for i in range(50)]
USAGE = {"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 50}}


async def measure(requests: int, stream: bool, database: str, count_calls: bool = False) -> float:
    """µs of process CPU per request, in the tree on sys.path (run as a child process); with
    `count_calls`, Python function calls per request instead (cProfile: exact, immune to the load)."""
    from core.ids import next_request_id
    from gateway.services import start_services
    from gateway.settings import Settings

    try:  # trees from before core/ (tried first: an installed checkout may provide another `core`)
        from gateway.context import RequestContext
    except ImportError:
        from core.context import RequestContext  # type: ignore[no-redef]

    deployment = {"name": "d", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    settings = Settings(master_key="sk-bench", database_url=f"sqlite+aiosqlite:///{database}",
                        models=[{"name": "m", "deployments": [deployment]}],
                        routing={"health_checks": False, "scrape_metrics": False})  # fmt: skip
    services = await start_services(settings)

    async def complete(endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        return dict(ANSWER)

    async def chunks(endpoint: str, body: dict[str, Any], request_id: str) -> Any:
        for chunk in [*CHUNKS, USAGE]:
            yield chunk

    for replica in services.routing.router.pools["m"]:
        replica.backend.complete, replica.backend.stream = complete, chunks
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}

    async def one() -> None:
        ctx = RequestContext(request_id=next_request_id(), endpoint="chat", body=dict(body), model="m",
                             headers={"authorization": "Bearer sk-bench"}, stream=stream,
                             started_at=time.perf_counter())  # fmt: skip
        reply = await services.handler(ctx)
        if reply.stream is not None:
            async for _ in reply.stream:
                pass

    for _ in range(300):  # warm-up
        await one()
    profile = cProfile.Profile() if count_calls else None
    started = time.process_time()
    if profile:
        profile.enable()
    for _ in range(requests):
        await one()
    if profile:
        profile.disable()
    spent = (time.process_time() - started) / requests * 1e6
    await services.aclose()
    if profile:
        return sum(row[1] for row in pstats.Stats(profile).stats.values()) / requests  # type: ignore[attr-defined]
    return spent


def run_tree(tree: str, requests: int, stream: bool, count_calls: bool = False) -> float:
    with tempfile.TemporaryDirectory() as folder:
        code = (f"import asyncio, runpy; measure = runpy.run_path({__file__!r})['measure']; "
                f"print('µs/request', asyncio.run(measure({requests}, {stream}, {str(Path(folder) / 'db.sqlite')!r}, "
                f"{count_calls})))")  # fmt: skip
        env = {**os.environ, "PYTHONPATH": tree}  # the tree's gateway, not this checkout's
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
        return float(
            next(line for line in out.stdout.splitlines() if line.startswith("µs/request")).split()[1]
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", nargs=2, help="source trees: before, after")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.lib.harness import write_json

    trees = [str(Path(tree).resolve()) for tree in args.trees]
    runs: dict[str, dict[str, list[float]]] = {}
    for kind in ("json", "stream_50_chunks"):
        runs[kind] = {tree: [] for tree in trees}
        for _ in range(args.rounds):
            for tree in trees:
                runs[kind][tree].append(run_tree(tree, args.requests, kind != "json"))
    calls = {kind: [run_tree(tree, 200, kind != "json", count_calls=True) for tree in trees] for kind in runs}
    print(f"{'answer':<18}{'before µs/req':>15}{'after µs/req':>14}{'change':>9}"
          f"{'before calls/req':>18}{'after calls/req':>17}{'change':>9}")  # fmt: skip
    rows = []
    for kind, by_tree in runs.items():
        before, after = (min(by_tree[tree]) for tree in trees)
        calls_before, calls_after = calls[kind]
        rows.append({"answer": kind, "before_us": before, "after_us": after, "runs": by_tree,
                     "before_calls": calls_before, "after_calls": calls_after})  # fmt: skip
        print(
            f"{kind:<18}{before:>15.0f}{after:>14.0f}{(after - before) / before:>+9.0%}"
            f"{calls_before:>18.0f}{calls_after:>17.0f}{(calls_after - calls_before) / calls_before:>+9.0%}"
        )
    print(f"wrote {write_json('pipeline_cpu', {'trees': trees, 'rows': rows})}")


if __name__ == "__main__":
    main()
