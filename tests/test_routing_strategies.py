"""Each strategy's choice under synthetic load and scraped metrics."""

import random
from collections import Counter

from core.models import DeploymentConfig
from routing.config import RoutingPolicy, RoutingSettings, ScoreWeights
from routing.metrics import RoutingMetrics
from routing.monitor import metrics_url, parse_engine_metrics
from routing.prefix import PrefixIndex, block_hashes, render_prompt
from routing.replica import EngineLoad
from routing.router import Router


class Named:
    """Just what the router reads from a backend: a name and its deployment config."""

    def __init__(self, name: str, weight: float = 1.0, backend: str = "openai") -> None:
        self.name = name
        self.config = DeploymentConfig(name=name, base_url=f"http://{name}:8000/v1", model="m", weight=weight,
                                       backend=backend)  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_router(names: list[str], clock: Clock | None = None, **settings: object) -> Router:
    pools = {"m": [Named(n) for n in names]}
    return Router(
        pools, RoutingSettings(**settings), {}, RoutingMetrics(), random.Random(7), clock or Clock()
    )


def first_choice(router: Router, strategy: str, body: dict | None = None) -> str:
    policy = RoutingPolicy(strategy=strategy)
    order, _ = router.plan("m", router.pools["m"], "chat", body or {"messages": []}, policy)
    return order[0].name


def test_weighted_random_follows_weights() -> None:
    pools = {"m": [Named("a", weight=3), Named("b", weight=1)]}
    router = Router(pools, RoutingSettings(), {}, RoutingMetrics(), random.Random(1))
    picks = Counter(first_choice(router, "weighted_random") for _ in range(4000))
    assert 0.70 < picks["a"] / 4000 < 0.80


def test_least_outstanding_picks_the_idlest() -> None:
    router = make_router(["a", "b", "c"])
    for replica, load in zip(router.pools["m"], [5, 1, 3], strict=True):
        replica.outstanding = load
    assert first_choice(router, "least_outstanding") == "b"


def test_least_outstanding_uses_fresh_engine_queue() -> None:
    clock = Clock()
    router = make_router(["a", "b"], clock)
    a, b = router.pools["m"]
    a.engine = EngineLoad(waiting=9, running=4, at=clock.now)  # busy with other gateways' requests
    assert first_choice(router, "least_outstanding") == "b"
    clock.now += 60  # the scrape went stale: only our own counts matter
    b.outstanding = 1
    assert first_choice(router, "least_outstanding") == "a"


def test_peak_ewma_avoids_the_slow_replica() -> None:
    router = make_router(["fast", "slow"])
    fast, slow = router.pools["m"]
    for _ in range(5):
        fast.latency.observe(0.05)
        slow.latency.observe(2.0)
    assert {first_choice(router, "peak_ewma") for _ in range(50)} == {"fast"}


def test_peak_ewma_jumps_up_at_once_and_decays_slowly() -> None:
    clock = Clock()
    router = make_router(["a"], clock, ewma_decay_s=10.0)
    ewma = router.pools["m"][0].latency
    ewma.observe(0.1)
    ewma.observe(3.0)
    assert ewma.value == 3.0
    clock.now += 10
    ewma.observe(0.1)
    assert 1.0 < ewma.value < 1.3  # e^-1 of the peak remains


def test_power_of_two_choices_spreads_equal_replicas() -> None:
    router = make_router(["a", "b", "c", "d"])
    picks = Counter(first_choice(router, "peak_ewma") for _ in range(400))
    assert len(picks) == 4 and min(picks.values()) > 40


def chat(system: str, user: str) -> dict:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def dispatch(router: Router, strategy: str, body: dict) -> str:
    order, hashes = router.plan("m", router.pools["m"], "chat", body, RoutingPolicy(strategy=strategy))
    router.prefixes.record(order[0].name, hashes)
    return order[0].name


def test_prefix_affinity_keeps_a_shared_prefix_on_one_replica() -> None:
    router = make_router(["a", "b", "c", "d"], prefix_block_chars=16)
    system = "You are a careful assistant for the billing team. " * 4
    first = dispatch(router, "prefix_affinity", chat(system, "question 0"))
    assert {dispatch(router, "prefix_affinity", chat(system, f"question {i}")) for i in range(1, 20)} == {
        first
    }


def test_prefix_affinity_longest_match_wins() -> None:
    router = make_router(["a", "b"], prefix_block_chars=16)
    short, long_ = "x" * 64, "x" * 64 + "y" * 64
    router.prefixes.record("a", block_hashes(render_prompt("chat", chat(short, "")), 16))
    router.prefixes.record("b", block_hashes(render_prompt("chat", chat(long_, "")), 16))
    assert first_choice(router, "prefix_affinity", chat(long_ + "z" * 40, "q")) == "b"


def test_prefix_affinity_spreads_when_the_preferred_replica_is_overloaded() -> None:
    router = make_router(["a", "b", "c"], prefix_block_chars=16, load_epsilon=0.25)
    body = chat("shared system prompt " * 8, "q")
    home = dispatch(router, "prefix_affinity", body)
    replicas = {r.name: r for r in router.pools["m"]}
    replicas[home].outstanding = 6  # far over (1+ε) × mean
    assert first_choice(router, "prefix_affinity", body) != home
    replicas[home].outstanding = 1  # within the bound again
    assert first_choice(router, "prefix_affinity", body) == home


def test_prefix_affinity_under_load_spreads_a_hot_prefix() -> None:
    """Simulated burst: 60 concurrent requests with one prefix; no replica takes more than its bound."""
    router = make_router(["a", "b", "c"], prefix_block_chars=16, load_epsilon=0.25)
    body = chat("hot prefix shared by everyone " * 8, "q")
    for _ in range(60):
        order, _ = router.plan(
            "m", router.pools["m"], "chat", body, RoutingPolicy(strategy="prefix_affinity")
        )
        order[0].outstanding += 1
    loads = sorted(r.outstanding for r in router.pools["m"])
    assert loads[-1] <= 25 and loads[0] >= 15


def test_engine_score_prefers_prefix_then_penalises_queue_and_kv() -> None:
    clock = Clock()
    router = make_router(["a", "b"], clock, prefix_block_chars=16)
    a, b = router.pools["m"]
    body = chat("long shared context " * 10, "q")
    router.prefixes.record("a", block_hashes(render_prompt("chat", body), 16))
    assert first_choice(router, "engine_score", body) == "a"
    a.engine = EngineLoad(waiting=20, running=8, kv_usage=0.97, at=clock.now)
    assert first_choice(router, "engine_score", body) == "b"


def test_engine_score_prefill_weight_weighs_the_prompts_a_replica_still_has_to_prefill() -> None:
    router = make_router(["a", "b"], prefix_block_chars=16, score_weights=ScoreWeights(prefill=1.0))
    a, b = router.pools["m"]
    body = chat("a long question that nobody has asked before " * 8, "q")
    a.pending_prefill = {None: 40}  # blocks of prompts sent to a that have no first token yet
    assert first_choice(router, "engine_score", body) == "b"  # same queue depth: b starts it sooner
    router.prefixes.record("a", block_hashes(render_prompt("chat", body), 16))
    assert first_choice(router, "engine_score", body) == "a"  # cached there: little of its own to prefill
    a.pending_prefill = {None: 400}
    assert first_choice(router, "engine_score", body) == "b"  # but not behind ten times as much work


def test_an_engine_that_schedules_by_priority_counts_only_the_urgent_prefill_ahead() -> None:
    pools = {"m": [Named("a", backend="local_engine"), Named("b", backend="local_engine")]}
    settings = RoutingSettings(prefix_block_chars=16, score_weights=ScoreWeights(prefill=1.0))
    router = Router(pools, settings, {}, RoutingMetrics(), random.Random(7), Clock())
    a, b = router.pools["m"]
    a.pending_prefill = {2: 400}  # a batch tenant's prompts (rank 2) wait on a
    b.pending_prefill = {0: 30}  # an interactive one's (rank 0) on b
    body = chat("a long question that nobody has asked before " * 8, "q")

    def choice(priority: int | None) -> str:
        order, _ = router.plan(
            "m", router.pools["m"], "chat", body, RoutingPolicy(strategy="engine_score"), priority
        )
        return order[0].name

    assert choice(0) == "a"  # an interactive prompt starts ahead of a's batch prefill
    assert choice(2) == "b" and choice(None) == "b"  # a batch one, or one without a rank, waits behind it
    assert a.prefill_ahead(1) == 0 and b.prefill_ahead(1) == 30


def test_engine_score_spreads_a_hot_prefix_within_the_load_bound() -> None:
    """60 concurrent requests with one cached prefix: the score alone would keep them all on its home."""
    router = make_router(["a", "b", "c"], prefix_block_chars=16, load_epsilon=0.25)
    body = chat("hot prefix shared by everyone " * 8, "q")
    home = dispatch(router, "engine_score", body)
    replicas = {r.name: r for r in router.pools["m"]}
    replicas[home].outstanding = 0
    for _ in range(60):
        order, _ = router.plan("m", router.pools["m"], "chat", body, RoutingPolicy(strategy="engine_score"))
        order[0].outstanding += 1
    loads = sorted(r.outstanding for r in router.pools["m"])
    assert loads[-1] <= 25 and loads[0] >= 15
    assert replicas[home].outstanding == loads[-1]  # the home still takes the most


def test_engine_score_is_the_default_for_engine_pools() -> None:
    pools = {"e": [Named("x", backend="local_engine")], "o": [Named("y")]}
    router = Router(pools, RoutingSettings(), {}, RoutingMetrics())
    assert router.strategy_name("e", None) == "engine_score"
    assert router.strategy_name("o", None) == "peak_ewma"
    assert (
        router.strategy_name("o", RoutingPolicy(strategies={"o": "least_outstanding"})) == "least_outstanding"
    )


def test_open_breakers_are_skipped() -> None:
    router = make_router(["a", "b"])
    router.pools["m"][0].breaker.trip()
    assert {first_choice(router, "weighted_random") for _ in range(30)} == {"b"}


def test_vllm_metrics_are_parsed_with_counter_deltas() -> None:
    text = (
        '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} 3\n'
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 2\n'
        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
        '# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{model_name="m"} 150\n'
        '# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{model_name="m"} 300\n'
    )
    previous = EngineLoad(hits=100, queries=200)
    load = parse_engine_metrics(text, previous, now=5.0)
    assert (load.waiting, load.running, load.kv_usage, load.at) == (3, 2, 0.5, 5.0)
    assert load.prefix_hit_rate == 0.5
    assert metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"


def test_the_kv_cache_size_is_read_from_cache_config_info() -> None:
    info = (
        '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",num_gpu_blocks="%s"} 1\n'
    )
    assert parse_engine_metrics(info % "1000", EngineLoad(), now=1.0).kv_tokens == 16000
    assert parse_engine_metrics(info % "None", EngineLoad(), now=1.0).kv_tokens is None  # not profiled yet
    assert parse_engine_metrics("", EngineLoad(), now=1.0).kv_tokens is None


def test_a_replica_remembers_only_the_blocks_its_kv_cache_holds_prefix_first() -> None:
    index = PrefixIndex(entries_per_replica=1000)
    first, second = block_hashes("a" * 40, 8), block_hashes("b" * 24, 8)
    index.record("r", first, capacity=2)
    assert index.match("r", first) == 2  # its tail went first: the leading two blocks still match
    index.record("r", second, capacity=2)
    assert index.match("r", first) == 0 and index.match("r", second) == 2
    index.record("big", first)  # size unknown: the configured bound only
    assert index.match("big", first) == 5


def test_the_router_sizes_a_replicas_index_from_its_scraped_kv_tokens() -> None:
    router = make_router(["a"])
    replica = router.pools["m"][0]
    replica.engine = EngineLoad(kv_tokens=64)  # 64 tokens x 4 characters = two 128-character blocks
    hashes = block_hashes("x" * 128 * 6, 128)
    router.record_prefix(replica, hashes)
    assert router.prefixes.match("a", hashes) == 2
