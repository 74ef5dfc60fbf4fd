"""Issue 43: trace loading and scaling keep the prefix structure; the hit-rate bounds; the round-robin baseline."""

import json
from pathlib import Path

from bench.lib.trace_data import (
    TRACES,
    TraceRequest,
    best_assignment_hit_rate,
    infinite_cache_hit_rate,
    infinite_cache_uncached,
    load,
    retime,
    scale,
    window,
    write_mooncake,
)
from tests.test_routing_strategies import first_choice, make_router


def test_round_robin_takes_replicas_in_turn() -> None:
    router = make_router(["a", "b", "c"])
    assert [first_choice(router, "round_robin") for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]


def test_infinite_cache_counts_leading_seen_blocks_in_tokens() -> None:
    trace = [
        TraceRequest(0, 100, 1, (1, 2)),
        TraceRequest(1, 150, 1, (1, 2, 3)),
        TraceRequest(2, 60, 1, (9, 2)),
    ]
    # 2nd: blocks 1, 2 seen (128 tokens of 150); 3rd: block 9 unseen, so block 2 does not count
    assert infinite_cache_hit_rate(trace, 64) == 128 / 310
    assert infinite_cache_uncached(trace, 64) == [100, 22, 60]  # what each must prefill however routed


def test_best_assignment_keeps_groups_together_under_the_load_cap() -> None:
    a, b = (1, 2), (7, 8)
    trace = [TraceRequest(i, 128, 1, a if i % 2 else b) for i in range(40)]
    best = best_assignment_hit_rate(trace, replicas=2, capacity_blocks=2, block=64)
    assert best["hit_rate"] == 38 / 40  # one cold miss per group, both groups fit side by side
    assert best["requests_per_replica"] == [20, 20]
    one_slot = best_assignment_hit_rate(trace, replicas=1, capacity_blocks=2, block=64)
    assert one_slot["hit_rate"] == 0.0  # a single 2-block LRU alternating between groups never hits


def test_scale_keeps_hash_ids_and_blocks(tmp_path: Path) -> None:
    trace = [TraceRequest(1000, 6758, 500, tuple(range(14)))]
    (scaled,) = scale(trace, length_div=16, time_factor=2.0)
    assert (scaled.t_ms, scaled.input_length, scaled.output_length) == (2000, 422, 31)
    assert scaled.hash_ids == tuple(range(14)) and scaled.input_length <= 14 * 32
    (cut,) = scale(trace, length_div=16, time_factor=1.0, max_input=100)
    assert cut.hash_ids == (0, 1, 2) and cut.input_length == 96
    (later,) = retime([scaled], 0.5)
    assert (later.t_ms, later.input_length, later.hash_ids) == (1000, 422, scaled.hash_ids)
    row = json.loads(write_mooncake([scaled], tmp_path / "t.jsonl").read_text())
    assert row == {"timestamp": 2000, "input_length": 422, "output_length": 31, "hash_ids": list(range(14))}


def test_shipped_traces_match_their_source_figures() -> None:
    if not (TRACES / "mooncake_conversation_trace.jsonl").exists():
        return  # shared/ is laid beside the checkout on the project's machines
    mooncake = load("mooncake")
    assert len(mooncake) == 12031
    seen: set[int] = set()
    hits = blocks = 0
    for r in mooncake:
        hits += sum(h in seen for h in r.hash_ids)
        blocks += len(r.hash_ids)
        seen.update(r.hash_ids)
    assert round(hits / blocks, 3) == 0.366  # SOURCE.md: 36.6 % of prompt blocks would hit
    first = window(mooncake, 60, 30)
    assert first and first[0].t_ms >= 0 and all(r.t_ms < 30_000 for r in first)
    assert len(load("azure_code")) == 8819
