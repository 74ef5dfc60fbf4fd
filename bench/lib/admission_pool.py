"""The pool under test of bench/admission_replay.py (issue 44): SmolLM2 engines behind gateway replicas that
share Redis, with admission on (fair), on without fairness (fifo), or off, and the tenants' keys.

Tenants are provisioned once into one SQLite database that every gateway of the run reads (a fresh set of
gateway processes per scenario and mode, so no queue, ledger or learned capacity carries over); each tenant's
policy has only its `routing` section: `{"service_class": ..., "weight": ...}` (RoutingPolicy), no limits.
Deployments get `send_priority: true` (the class's rank reaches the engine's priority scheduler) and no
`max_concurrency` unless asked: the gateway learns each engine's slots from its scraped metrics, which needs
the engine to be seen saturated once, so `learn_capacity` sends a burst through each replica first and waits
until its `llmgw_admission_pool_slots` is a number. While a case runs: waits on the engines' counters (idle
before it starts, a tenant's first request arrived), AIPerf launched per tenant, the replicas' slots sampled.
"""

import asyncio
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.lib.engine_http import EngineServer
from bench.lib.engine_pool import KEY, gateway_config, one_request, wait_ready
from bench.lib.harness import Process, start_gateway
from bench.lib.trace_aiperf import run_aiperf
from bench.lib.trace_data import TraceRequest
from gateway.settings import Settings
from policies.policy import Policy
from policies.provision import provision_virtual_key

REDIS_URL = "redis://127.0.0.1:6379/0"
MODES: dict[str, dict[str, Any]] = {
    "fair": {"enabled": True, "fair": True},  # weighted fair sharing between tenants of a class
    # the same without latency feedback (routing/admission/guard.py): shares by slots alone
    "noguard": {"enabled": True, "fair": True, "slo_guard": {"enabled": False}},
    "fifo": {"enabled": True, "fair": False},  # first come, first served within a class
    "off": {"enabled": False, "fair": True},  # no admission: requests go straight to the engines
}


@dataclass(frozen=True)
class Tenant:
    name: str
    service_class: str
    weight: float = 1.0


def pool_config(
    engines: list[EngineServer], mode: str, database_url: str, classes: dict[str, dict[str, float]],
    max_concurrency: int | None, redis_prefix: str, redis_url: str | None = REDIS_URL,
    send_priority: bool = True, engine_queue: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """engine_routing's gateway config (one alias `pool`, an engine pool scraped every 0.5 s) plus admission,
    priority (`send_priority` False: the engines see every request alike, as vLLM without
    --scheduling-policy priority), a shared database and Redis."""
    config = gateway_config(engines, "least_outstanding")
    for deployment in config["models"][0]["deployments"]:
        deployment["send_priority"] = send_priority
        if max_concurrency:
            deployment["max_concurrency"] = max_concurrency
    config["database_url"] = database_url
    config["redis_url"] = redis_url  # None: limits and admission per gateway replica
    # 1 s, not the 50 ms default: on a busy 2-core box a starved process misses 50 ms (bench/gateway_overhead.py)
    config["policies"] = {"redis_prefix": redis_prefix, "redis_timeout_s": 1.0}
    config["routing"]["admission"] = {**MODES[mode], "classes": classes}
    if engine_queue is not None:  # None: as shipped
        config["routing"]["admission"]["engine_queue"] = engine_queue
    config["observability"] = {"tenant_label": True}
    return config


async def provision(config: dict[str, Any], tenants: list[Tenant]) -> dict[str, str]:
    """A key per tenant, its policy carrying only the service class and weight."""
    settings = Settings(**config)
    keys = {}
    for tenant in tenants:
        policy = Policy(routing={"service_class": tenant.service_class, "weight": tenant.weight})
        keys[tenant.name] = await provision_virtual_key(settings, tenant.name, policy)
    return keys


class GatewayFleet:
    """`count` gateway replicas of one config (sharing Redis and the database), started and stopped together."""

    def __init__(self, config: dict[str, Any], count: int) -> None:
        self.config = config
        self.replicas: list[Process] = [start_gateway(config) for _ in range(count)]

    async def ready(self) -> None:
        async with aiohttp.ClientSession(headers={"authorization": f"Bearer {KEY}"}) as session:
            for replica in self.replicas:
                await wait_ready(session, replica.url)

    def url(self, index: int) -> str:
        return self.replicas[index % len(self.replicas)].url

    async def metrics(self) -> list[dict[str, float]]:
        """Each replica's llmgw_admission_* series (name{labels} -> value)."""
        out = []
        async with aiohttp.ClientSession() as session:
            for replica in self.replicas:
                async with session.get(replica.url + "/metrics") as response:
                    out.append(admission_series(await response.text()))
        return out

    def stop(self) -> None:
        """Terminate all; a replica still draining requests (whose clients timed out) after 20 s is killed."""
        for replica in self.replicas:
            replica.popen.terminate()
        for replica in self.replicas:
            try:
                replica.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                replica.popen.kill()
                replica.popen.wait()


def admission_series(text: str) -> dict[str, float]:
    series = {}
    for match in re.finditer(r"^(llmgw_admission_[a-z_]+(?:\{[^}]*\})?) (\S+)$", text, re.M):
        series[match[1]] = float(match[2])
    return series


def series_value(series: dict[str, float], name: str, label: str = "") -> float | None:
    """The first series of `name` (carrying `label`, e.g. 'class="batch"') whose value is a number."""
    for key, value in series.items():
        if key.startswith(name) and label in key and value == value:  # not NaN
            return value
    return None


def slots_of(series: dict[str, float]) -> float | None:
    return series_value(series, "llmgw_admission_pool_slots")


async def learn_capacity(
    fleet: GatewayFleet, key: str, clients: int, timeout_s: float = 90
) -> list[float | None]:
    """Saturate the engines through each replica, closed loop, until it has learned the pool's slots (admission
    on). A closed loop, not bursts: a replica learns from the latest scrape when a request arrives, so the
    engines must be seen waiting while requests keep arriving (a burst arrives before its own queue shows)."""
    headers = {"authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=300)) as session:
        for index in range(len(fleet.replicas)):
            await _saturate(fleet, index, session, clients, time.monotonic() + timeout_s)
    return [slots_of(series) for series in await fleet.metrics()]


async def _saturate(
    fleet: GatewayFleet, index: int, session: aiohttp.ClientSession, clients: int, deadline: float
) -> None:
    body = {"model": "pool", "prompt": "capacity probe " * 40, "max_tokens": 16, "ignore_eos": True,
            "temperature": 0}  # fmt: skip
    learned = asyncio.Event()

    async def client() -> None:
        while not learned.is_set() and time.monotonic() < deadline:
            async with session.post(fleet.url(index) + "/v1/completions", json=body) as response:
                await response.read()

    async def watch() -> None:
        while time.monotonic() < deadline and slots_of((await fleet.metrics())[index]) is None:
            await asyncio.sleep(0.5)
        learned.set()

    await asyncio.gather(watch(), *(client() for _ in range(clients)))


def new_database_url() -> str:
    return f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='llmgw-admission-')}/llmgw.db"


async def pool_capacity(
    engines: list[EngineServer],
    requests: list[TraceRequest],
    cal: dict[str, float],
    seconds: float,
    clients: int,
    warmup_s: float | None = None,
) -> dict[str, float]:
    """The pool's measured capacity for a request mix: `clients` closed-loop clients per engine (more than it runs
    at once, so it always has requests waiting) send `requests` in turn (unique prompts of their input length,
    their output length with ignore_eos); after `warmup_s` (default: `seconds` / 2) the engines' own counters
    are read twice, `seconds` apart: prompt tokens scheduled (vllm:prefix_cache_queries), tokens generated and
    requests finished, per second, and that work in batch-1 seconds (`cal`'s seconds per token). Counters, not
    the requests that ended in the window: on a GPU with 30k-token prompts a request outlasts a short window,
    and counting only those that ended undercounted the pool's work by several times."""
    turn = iter(range(10**9))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def client(engine: EngineServer) -> None:
            while True:
                index = next(turn)
                r = requests[index % len(requests)]
                prompt = f"{index} " + "ledger " * max(r.input_length - 2, 1)
                await one_request(session, engine.url, prompt, r.output_length, model="m")

        tasks = [asyncio.create_task(client(e)) for e in engines for _ in range(clients)]
        try:
            await asyncio.sleep(seconds / 2 if warmup_s is None else warmup_s)
            before = [await e.counters() for e in engines]
            await asyncio.sleep(seconds)
            after = [await e.counters() for e in engines]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    names = {"prompt": "vllm:prefix_cache_queries_total", "completion": "vllm:generation_tokens_total",
             "requests": "vllm:request_success_total"}  # fmt: skip
    served = {k: sum(a.get(n, 0.0) - b.get(n, 0.0) for a, b in zip(after, before, strict=True))
              for k, n in names.items()}  # fmt: skip
    work = served["prompt"] * cal["s_per_prompt_token"] + served["completion"] * cal["s_per_output_token"]
    return {**{k: v / seconds for k, v in served.items()}, "tok_s": (served["prompt"] + served["completion"]) / seconds,
            "work_rate": work / seconds, "seconds": seconds}  # fmt: skip


async def _wait_counters(
    engines: list[EngineServer], done: Callable[[list[dict[str, float]]], bool], timeout_s: float
) -> float:
    """Polls the engines' counters every 0.5 s until `done` says so; the seconds waited (timeout_s at most)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if done([await engine.counters() for engine in engines]):
            break
        await asyncio.sleep(0.5)
    return time.monotonic() - start


async def wait_idle(engines: list[EngineServer], timeout_s: float = 120.0) -> float:
    """Waits until no engine runs or holds a request (what an earlier case or probe left still finishing), so
    that every case starts on an idle pool. Returns the seconds waited."""

    def idle(counters: list[dict[str, float]]) -> bool:
        busy = ("vllm:num_requests_running", "vllm:num_requests_waiting")
        return not any(c.get(name, 0.0) for c in counters for name in busy)

    return await _wait_counters(engines, idle, timeout_s)


async def first_traffic(engines: list[EngineServer], timeout_s: float = 600.0) -> float:
    """Waits until the engines' prompt-token counters rise above what they were at the call: the first request
    of a load generator started beside it has arrived (AIPerf synthesises every prompt before it sends, which
    for thousands of full-length prompts takes minutes, so a fixed head start does not order two tenants).
    Returns the seconds waited (timeout_s at most)."""

    def prompt_tokens(counters: list[dict[str, float]]) -> float:
        return sum(c.get("vllm:prompt_tokens_total", 0.0) for c in counters)

    before = prompt_tokens([await engine.counters() for engine in engines])
    return await _wait_counters(engines, lambda counters: prompt_tokens(counters) > before, timeout_s)


async def launch(
    command: list[str], delay_s: float, timeout: float, after: list[EngineServer] | None
) -> float:
    """A delayed tenant starts `delay_s` after the others' first request reached the engines (`after`)."""
    if after:
        await first_traffic(after)
    await asyncio.sleep(delay_s)
    return await asyncio.to_thread(run_aiperf, command, timeout)


async def sample_slots(
    fleet: GatewayFleet, seen: list[list[float | None]], factors: list[list[float | None]]
) -> None:
    """Each replica's estimate of the pool's slots and its batch class's share factor (latency feedback),
    every second, while the load runs."""
    while True:
        metrics = await fleet.metrics()
        seen.append([slots_of(series) for series in metrics])
        factors.append([series_value(s, "llmgw_admission_share_factor", 'class="batch"') for s in metrics])
        await asyncio.sleep(1.0)


ENGINE_SERIES = ("vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "llmgw_engine_step_seconds_total",
                 "llmgw_engine_budget_seconds_total")  # fmt: skip


async def sample_engines(engines: list[EngineServer], seen: list[dict[str, float]]) -> None:
    """Every second, the engines' steps and step tokens so far and their running / waiting requests, summed
    over the pool: whether the pool was busy (a batch tenant below its share beside idle steps is the gateway's
    doing; beside full steps, the pool's)."""
    while True:
        counters = await asyncio.gather(*(engine.counters() for engine in engines))
        seen.append({"t": time.time(), **{k: sum(c.get(k, 0.0) for c in counters) for k in ENGINE_SERIES}})
        await asyncio.sleep(1.0)


def engine_window(
    seen: list[dict[str, float]], window: tuple[float, float], budget: int, engines: int
) -> dict:
    """The pool's steps within `window`: steps a second (per engine), tokens a step, its fill (tokens over the
    step budget), the mean running and waiting requests and the engines' mean KV-cache usage (a pool can be full
    by memory with its steps part empty); from our engines' own counters, the share of the time each engine
    was in a step (`busy`) and the share of its step budget used over time (`budget_use`: a step's tokens over
    the budget, weighted by the step's time; iteration tokens count a prompt whole in the step of its first
    token, so their average per step is not a fill); {} when fewer than two samples fall in it."""
    inside = [s for s in seen if window[0] <= s["t"] <= window[1]]
    if len(inside) < 2:
        return {}
    first, last = inside[0], inside[-1]
    seconds = last["t"] - first["t"]
    steps = last["vllm:iteration_tokens_total_count"] - first["vllm:iteration_tokens_total_count"]
    tokens = last["vllm:iteration_tokens_total_sum"] - first["vllm:iteration_tokens_total_sum"]
    return {
        "steps_per_s": steps / seconds / engines,
        "tokens_per_s": tokens / seconds,
        "tokens_per_step": tokens / steps if steps else 0.0,
        "step_fill": tokens / steps / budget if steps else 0.0,
        "running_mean": sum(s["vllm:num_requests_running"] for s in inside) / len(inside),
        "waiting_mean": sum(s["vllm:num_requests_waiting"] for s in inside) / len(inside),
        "kv_usage_mean": sum(s.get("vllm:kv_cache_usage_perc", 0.0) for s in inside) / len(inside) / engines,
        **{
            name: (last[series] - first[series]) / seconds / engines
            for name, series in (("busy", "llmgw_engine_step_seconds_total"),
                                 ("budget_use", "llmgw_engine_budget_seconds_total"))
            if last.get(series)
        },
    }  # fmt: skip


def slot_stats(seen: list[list[float | None]]) -> list[dict[str, float]]:
    out = []
    for column in zip(*seen, strict=True):
        known = [v for v in column if v is not None]
        out.append({"min": min(known), "mean": sum(known) / len(known), "max": max(known)} if known else {})
    return out


def compact(series: dict[str, float]) -> dict[str, float]:
    keep = ("llmgw_admission_shed_total", "llmgw_admission_slo_requests_total", "llmgw_admission_served_tokens_total",
            "llmgw_admission_pool_slots")  # fmt: skip
    return {k: v for k, v in series.items() if k.startswith(keep)}
