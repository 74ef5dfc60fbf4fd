"""Engine-aware routing against two real engine servers (issue 17, item 6).

Two `llmgw engine serve` processes sit behind one gateway alias, `pool`, declared an engine pool
(`routing.engine_pools`), so the gateway scrapes their vLLM-named /metrics (queue depth, KV-cache usage,
prefix-cache hits) and routes by the strategy under test. The same workload runs once per strategy, each
with a fresh gateway and fresh prompt texts, so no strategy inherits another's prefix cache:

- `--groups` groups; every request of a group shares one long prefix (about `--prefix-tokens` tokens) and
  ends in its own short question, as with agents or RAG over a shared system prompt;
- `--clients` closed-loop clients send `--requests` requests in all, groups drawn from one seeded sequence
  that every strategy replays;
- streamed `/v1/completions`, `--max-tokens` tokens, `ignore_eos` (a vLLM parameter the gateway passes on).

Each engine's KV pool (`--kv-mb`) holds about half the groups' prefixes, as in a real fleet, where one
replica cannot hold every tenant's context: a strategy that spreads a group over both engines pays in
evictions and cold prefills. Printed per strategy: TTFT (client side, first streamed token) p50 / p90 /
mean, the prefix-cache hit rate (Δhits / Δqueries of both engines), the split between engines
(`x-served-by`), group affinity (mean share of a group's requests on its most used engine), and tokens/s.

    .venv/bin/python -m bench.engine_routing                                  # CPU, SmolLM2
    .venv/bin/python -m bench.engine_routing --device cuda --random-shape llama-1b --dtype bf16 \\
        --groups 16 --clients 32 --requests 512 --prefix-tokens 2000 --kv-mb 600 --max-tokens 32
"""

import argparse
import asyncio
import random
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from bench.lib.engine_http import EngineServer
from bench.lib.engine_pool import (
    KEY,
    export_tokenizer,
    gateway_config,
    one_request,
    random_model_folder,
    wait_ready,
)
from bench.lib.harness import start_gateway, write_json
from routing.replica import EngineLoad

STRATEGIES = ["engine_score", "prefix_affinity", "least_outstanding", "weighted_random"]
WORDS = ["policy", "account", "ledger", "invoice", "region", "tenant", "quota", "replica", "shard", "cluster", "window", "budget", "latency", "token", "cache", "router", "engine", "stream", "batch", "prefix", "schema", "record", "audit"]  # fmt: skip


def start_engine(args: argparse.Namespace, model: str | None) -> EngineServer:
    settings = dict(served_model_name="m", dtype=args.dtype, device=args.device, kv_cache_memory_mb=args.kv_mb,
                    num_threads=args.threads, max_model_len=args.prefix_tokens * 2 + 256,
                    max_num_batched_tokens=args.batched_tokens)  # fmt: skip
    return EngineServer(**settings, **({"model": model} if model else {}))


def workload(args: argparse.Namespace, salt: str) -> list[tuple[int, str]]:
    """(group, prompt) per request; the group sequence is the same for every strategy, the texts are not."""
    draw = random.Random(args.seed)
    texts = random.Random(f"{args.seed}-{salt}")
    words_per_prefix = int(args.prefix_tokens / 1.04)  # these words: ~1.04 SmolLM2 tokens each
    prefixes = [
        f"[{salt} group {g}] " + " ".join(texts.choice(WORDS) for _ in range(words_per_prefix))
        for g in range(args.groups)
    ]
    plan = []
    for i in range(args.requests):
        group = draw.randrange(args.groups)
        plan.append((group, f"{prefixes[group]}\nQuestion {i}: what is {draw.randrange(1000)} plus one?\n"))
    return plan


async def engine_counters(engines: list[EngineServer]) -> EngineLoad:
    """Both engines' prefix-cache counters, summed."""
    totals = [await engine.counters() for engine in engines]
    return EngineLoad(
        hits=sum(t.get("vllm:prefix_cache_hits_total", 0.0) for t in totals),
        queries=sum(t.get("vllm:prefix_cache_queries_total", 0.0) for t in totals),
    )


async def warm_up(args: argparse.Namespace, engines: list[EngineServer]) -> None:
    """The same kind of traffic sent straight to each engine before the first strategy runs, so that no
    strategy pays for first-use work. On CUDA, Triton compiles a kernel variant on its first use; without
    this warm-up, engine_score, which runs first, had the worst tail of the four strategies in both H200
    runs (the suspected cause, not proven). Its prefixes are its own, so they give no strategy cache hits."""
    if not args.warmup_requests:
        return
    plan = workload(args, salt="warm-up")[: args.warmup_requests]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:

        async def client(url: str, queue: list[str]) -> None:
            while queue:
                await one_request(session, url, queue.pop(0), args.max_tokens, model="m")

        for engine in engines:
            await engine.wait_ready()
            queue = [prompt for _, prompt in plan]
            await asyncio.gather(*(client(engine.url, queue) for _ in range(max(1, args.clients // 2))))


async def run_strategy(
    args: argparse.Namespace, engines: list[EngineServer], strategy: str
) -> dict[str, Any]:
    gateway = start_gateway(gateway_config(engines, strategy))
    headers = {"authorization": f"Bearer {KEY}"}
    try:
        async with aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=1800)
        ) as session:
            for engine in engines:
                await engine.wait_ready()  # the model is loaded
            await wait_ready(session, gateway.url)
            await asyncio.sleep(1.5)  # the first metrics scrape
            plan = workload(args, salt=strategy)
            before = await engine_counters(engines)
            queue = list(enumerate(plan))
            results: list[dict] = [{} for _ in plan]

            async def client() -> None:
                while queue:
                    index, (group, prompt) = queue.pop(0)
                    results[index] = {"group": group, **await one_request(session, gateway.url, prompt,
                                                                           args.max_tokens)}  # fmt: skip

            start = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(args.clients)))
            elapsed = time.perf_counter() - start
            after = await engine_counters(engines)
    finally:
        gateway.stop()
    return summarise(strategy, results, before, after, elapsed)


def summarise(
    strategy: str, results: list[dict], before: EngineLoad, after: EngineLoad, elapsed: float
) -> dict:
    ttfts = sorted(r["ttft"] * 1000 for r in results if r["ttft"] is not None)
    per_group: dict[int, Counter] = {}
    for r in results:
        per_group.setdefault(r["group"], Counter())[r["served"]] += 1
    affinity = statistics.mean(max(c.values()) / sum(c.values()) for c in per_group.values())
    queries = after.queries - before.queries
    return {
        "strategy": strategy,
        "requests": len(results),
        "ttft_p50_ms": ttfts[len(ttfts) // 2],
        "ttft_p90_ms": ttfts[int(len(ttfts) * 0.9)],
        "ttft_mean_ms": statistics.mean(ttfts),
        "prefix_hit_rate": (after.hits - before.hits) / queries if queries else 0.0,
        "cached_share": sum(r["cached_tokens"] for r in results)
        / max(sum(r["prompt_tokens"] for r in results), 1),
        "prompt_tokens_mean": statistics.mean(r["prompt_tokens"] for r in results),
        "split": dict(sorted(Counter(r["served"] for r in results).items())),
        "group_affinity": affinity,
        "tokens_per_s": sum(r["tokens"] for r in results) / elapsed,
        "elapsed_s": elapsed,
    }


def print_table(rows: list[dict], setup: dict) -> None:
    print(f"\nengine-aware routing: {setup}")
    print(f"{'strategy':<18} {'TTFT p50':>9} {'p90':>8} {'mean':>8} {'hit rate':>9} {'cached':>7} {'affinity':>9} "
          f"{'tok/s':>7}  split")  # fmt: skip
    for r in rows:
        print(f"{r['strategy']:<18} {r['ttft_p50_ms']:>7.0f}ms {r['ttft_p90_ms']:>6.0f}ms "
              f"{r['ttft_mean_ms']:>6.0f}ms {r['prefix_hit_rate']:>9.3f} {r['cached_share']:>7.3f} {r['group_affinity']:>9.3f} "
              f"{r['tokens_per_s']:>7.1f}  {r['split']}")  # fmt: skip


async def main_async(args: argparse.Namespace) -> None:
    model = args.model
    if args.random_shape:
        folder = Path(args.work_dir) / args.random_shape
        model = random_model_folder(args.random_shape, folder, Path(args.tokenizer_dir), args.dtype)
    setup = {k: getattr(args, k) for k in ("device", "dtype", "random_shape", "groups", "clients", "requests",
                                           "prefix_tokens", "max_tokens", "kv_mb", "threads", "batched_tokens")}  # fmt: skip
    setup["model"] = args.random_shape or args.model or "SmolLM2-135M (packaged GGUF)"
    engines = [start_engine(args, model) for _ in range(2)]
    rows: list[dict] = []
    try:
        await warm_up(args, engines)
        for strategy in args.strategies:
            rows.append(await run_strategy(args, engines, strategy))
            path = write_json(args.name, {"setup": setup, "rows": rows})  # kept if a later strategy fails
            print(f"{strategy}: done", flush=True)
    finally:
        for engine in engines:
            engine.stop()
    print_table(rows, setup)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="int4")
    parser.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2)")
    parser.add_argument(
        "--random-shape", default=None, help="a bench.lib.engine_gpu_models shape, e.g. llama-1b"
    )
    parser.add_argument("--tokenizer-dir", default=".gpu/tokenizer", help="tokenizer.json for --random-shape")
    parser.add_argument("--work-dir", default="/tmp/engine_routing")
    parser.add_argument("--export-tokenizer", default=None, help="write SmolLM2's tokenizer.json here, exit")
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--prefix-tokens", type=int, default=384)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--kv-mb", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batched-tokens", type=int, default=256, help="engines' max_num_batched_tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup-requests", type=int, default=None,
                        help="requests sent straight to each engine first (default 2 x clients; 0: none)")  # fmt: skip
    parser.add_argument("--strategies", nargs="+", default=STRATEGIES)
    parser.add_argument("--name", default="engine_routing_cpu", help="results file name under bench/results")
    args = parser.parse_args()
    if args.warmup_requests is None:
        args.warmup_requests = 2 * args.clients
    if args.export_tokenizer:
        export_tokenizer(Path(args.export_tokenizer))
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
