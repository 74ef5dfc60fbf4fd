"""Scheduler invariants under random workloads, with a simulated (tensor-free) model step."""

import random

import pytest

from backends.local_engine.engine.block_manager import BlockManager
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.scheduler import Scheduler
from backends.local_engine.engine.sequence import Sequence, SequenceStatus

BS = 4


def next_token(tokens: list[int]) -> int:
    return (tokens[-1] * 31 + len(tokens) * 7 + 3) % 1000


def make_scheduler(num_blocks: int, budget: int = 32, max_seqs: int = 8, caching: bool = True) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BS, caching), budget, max_seqs)


def simulate_step(sched: Scheduler) -> list[Sequence]:
    """Compute what was scheduled; append one token to sequences whose chunk reached the end."""
    finished = []
    for item in sched.schedule().scheduled:
        seq = item.seq
        seq.num_computed_tokens += item.num_new_tokens
        sched.block_manager.cache_full_blocks(seq)
        if seq.num_computed_tokens == len(seq):
            seq.append_token(next_token(seq.token_ids))
            if len(seq.output_ids) >= seq.params.max_tokens:
                sched.finish(seq, "length")
                finished.append(seq)
    return finished


def check_block_invariants(sched: Scheduler) -> None:
    bm = sched.block_manager
    refs = [0] * bm.num_blocks
    for seq in sched.running:
        assert len(seq.block_table) >= bm.blocks_for(seq.num_computed_tokens)
        for block_id in seq.block_table:
            refs[block_id] += 1
    for seq in sched.waiting:
        assert seq.block_table == []
    assert refs == [b.ref_count for b in bm.blocks]
    assert bm.num_free_blocks == sum(1 for r in refs if r == 0)


def random_workload(rng: random.Random, n: int, shared_prefix: list[int]) -> list[Sequence]:
    seqs = []
    for _ in range(n):
        prompt = shared_prefix[: rng.randint(0, len(shared_prefix))] + [rng.randrange(1000)] * rng.randint(
            1, 40
        )
        seqs.append(Sequence(prompt, SamplingParams(max_tokens=rng.randint(1, 20))))
    return seqs


def run_to_completion(sched: Scheduler, seqs: list[Sequence], rng: random.Random, abort_p: float = 0.0):
    pending = list(seqs)
    steps = 0
    while pending or sched.has_work:
        for _ in range(rng.randint(0, 3)):
            if pending:
                sched.add(pending.pop(0))
        simulate_step(sched)
        if abort_p and sched.running and rng.random() < abort_p:
            sched.abort(rng.choice(sched.running).seq_id)
        check_block_invariants(sched)
        steps += 1
        assert steps < 10_000, "scheduler made no progress"


def test_budget_and_seq_limits_hold_and_everything_finishes():
    rng = random.Random(0)
    sched = make_scheduler(num_blocks=40, budget=24, max_seqs=5)
    seqs = random_workload(rng, 60, shared_prefix=list(range(500, 530)))
    original_schedule = sched.schedule

    def checked_schedule():
        out = original_schedule()
        assert out.num_batched_tokens <= 24
        assert len(out.scheduled) <= 5 and len(sched.running) <= 5
        assert all(item.num_new_tokens > 0 for item in out.scheduled)
        return out

    sched.schedule = checked_schedule
    run_to_completion(sched, seqs, rng)
    assert all(s.status == SequenceStatus.FINISHED for s in seqs)
    assert all(len(s.output_ids) == s.params.max_tokens for s in seqs)
    assert sched.block_manager.num_free_blocks == 40


def test_random_aborts_never_leak_or_double_free_blocks():
    rng = random.Random(1)
    sched = make_scheduler(num_blocks=30, budget=16, max_seqs=6)
    seqs = random_workload(rng, 50, shared_prefix=list(range(100, 120)))
    run_to_completion(sched, seqs, rng, abort_p=0.2)
    assert all(s.is_finished for s in seqs)
    assert sched.block_manager.num_free_blocks == 30


def test_preemption_with_tiny_pool_gives_same_outputs_as_unconstrained():
    rng = random.Random(2)
    tiny = make_scheduler(num_blocks=20, budget=16, max_seqs=8)
    big = make_scheduler(num_blocks=400, budget=16, max_seqs=8)
    workload = random_workload(rng, 30, shared_prefix=list(range(16)))
    copies = [Sequence(list(s.token_ids), s.params) for s in workload]
    run_to_completion(tiny, workload, random.Random(3))
    run_to_completion(big, copies, random.Random(3))
    assert tiny.num_preemptions > 0
    assert big.num_preemptions == 0
    assert [s.output_ids for s in workload] == [s.output_ids for s in copies]


def test_prefix_hit_counters_leave_out_re_admissions_after_a_preemption():
    """A preempted sequence re-admitted finds its own earlier blocks: those are not the workload's prefix
    reuse (counted apart), so the tiny pool's queries equal the big one's, prompt tokens once each."""
    tiny = make_scheduler(num_blocks=20, budget=16, max_seqs=8)
    big = make_scheduler(num_blocks=400, budget=16, max_seqs=8)
    workload = [
        Sequence(list(range(500 + 40 * i, 530 + 40 * i)), SamplingParams(max_tokens=12)) for i in range(12)
    ]
    copies = [Sequence(list(s.token_ids), s.params) for s in workload]
    run_to_completion(tiny, workload, random.Random(3))
    run_to_completion(big, copies, random.Random(3))
    assert tiny.num_preemptions > 0
    stats, reference = tiny.block_manager.stats, big.block_manager.stats
    assert stats.queries == reference.queries == sum(len(s.token_ids) - len(s.output_ids) for s in copies)
    assert stats.hits == reference.hits == 0  # no prompt shares a block with another
    assert stats.resumed_queries > 0 and stats.resumed_hits > 0


def test_decodes_are_scheduled_before_a_long_prefill():
    sched = make_scheduler(num_blocks=100, budget=8, max_seqs=4)
    short = Sequence([1, 2, 3], SamplingParams(max_tokens=50))
    sched.add(short)
    simulate_step(sched)  # prefill of the short prompt
    sched.add(Sequence(list(range(100)), SamplingParams(max_tokens=5)))
    for _ in range(5):
        out = sched.schedule()
        chunks = {item.seq.seq_id: item.num_new_tokens for item in out.scheduled}
        assert chunks[short.seq_id] == 1  # the decode always runs
        assert out.num_batched_tokens == 8  # the long prompt is chunked into the rest of the budget
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
        short.append_token(7)


def test_preempted_request_goes_back_to_the_front_newest_first():
    sched = make_scheduler(num_blocks=6, budget=64, max_seqs=4, caching=False)
    old, new = (
        Sequence([1] * 7, SamplingParams(max_tokens=16)),
        Sequence([2] * 7, SamplingParams(max_tokens=16)),
    )
    sched.add(old)
    sched.add(new)
    while sched.num_preemptions == 0:
        simulate_step(sched)
    assert sched.waiting[0] is new and new.block_table == []
    assert sched.running == [old]


def test_abort_frees_blocks_at_once():
    sched = make_scheduler(num_blocks=10)
    seq = Sequence(list(range(12)), SamplingParams(max_tokens=8))
    sched.add(seq)
    simulate_step(sched)
    assert sched.block_manager.num_free_blocks < 10
    assert sched.abort(seq.seq_id) is seq
    assert seq.finish_reason == "abort" and sched.block_manager.num_free_blocks == 10
    assert sched.abort(seq.seq_id) is None


def test_shared_prefix_is_served_from_cache():
    sched = make_scheduler(num_blocks=50, budget=64)
    system = list(range(40))
    first = Sequence(system + [1, 2], SamplingParams(max_tokens=2))
    sched.add(first)
    while not first.is_finished:
        simulate_step(sched)
    second = Sequence(system + [3, 4], SamplingParams(max_tokens=2))
    sched.add(second)
    out = sched.schedule()
    assert second.num_cached_tokens == 40
    assert out.scheduled[0].num_new_tokens == 2


def test_request_larger_than_the_pool_is_refused():
    sched = make_scheduler(num_blocks=4)
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        sched.add(Sequence(list(range(10)), SamplingParams(max_tokens=10)))


def test_speculative_drafts_that_do_not_fit_the_budget_are_dropped():
    sched = make_scheduler(num_blocks=20, budget=3)
    seq = Sequence([1, 2, 3], SamplingParams(max_tokens=10))
    sched.add(seq)
    simulate_step(sched)  # prefill; one token appended
    seq.token_ids.extend([7, 8, 9, 10])
    seq.num_draft_tokens = 4
    item = sched.schedule().scheduled[0]
    assert (item.num_new_tokens, item.num_logits, seq.num_draft_tokens) == (3, 3, 2)
    assert seq.token_ids[-2:] == [7, 8]


def test_scheduled_tokens_count_every_batch_preemptions_included() -> None:
    rng = random.Random(7)
    sched = make_scheduler(num_blocks=12, budget=16, max_seqs=4)  # few blocks: preemptions happen
    for _ in range(10):
        sched.add(
            Sequence([rng.randrange(1000) for _ in range(rng.randint(3, 20))], SamplingParams(max_tokens=8))
        )
    total = 0
    while sched.has_work:
        before = sched.scheduled_tokens
        output = sched.schedule()
        assert sched.scheduled_tokens - before == output.num_batched_tokens <= 16
        total += output.num_batched_tokens
        for item in output.scheduled:
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            if seq.num_computed_tokens == len(seq):
                seq.append_token(next_token(seq.token_ids))
                if len(seq.output_ids) >= seq.params.max_tokens:
                    sched.finish(seq, "length")
    assert sched.scheduled_tokens == total and sched.num_preemptions > 0
