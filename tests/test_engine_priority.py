"""vLLM's `priority` in the engine: the scheduler serves waiting sequences by (priority, arrival) and, short
of KV blocks, preempts the lowest-priority, latest-arrived running sequence first; the server takes the field
on both endpoints and refuses a non-integer with a 400 in OpenAI's error shape."""

import fake_engine_server
import httpx
import pytest
from test_scheduler import make_scheduler, simulate_step

from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.engine.sequence import Sequence

server, client = fake_engine_server.server, fake_engine_server.client  # the fixtures


def seq(token: int, priority: int, max_tokens: int = 16, length: int = 7) -> Sequence:
    return Sequence([token] * length, SamplingParams(max_tokens=max_tokens, priority=priority))


def test_low_priority_running_sequence_is_preempted_before_a_higher_one_that_arrived_later():
    sched = make_scheduler(num_blocks=6, budget=64, max_seqs=4, caching=False)
    low, high = seq(1, priority=5), seq(2, priority=0)  # low arrived first: FCFS would preempt high
    sched.add(low)
    sched.add(high)
    while sched.num_preemptions == 0:
        simulate_step(sched)
    assert sched.running == [high] and sched.waiting == [low] and low.block_table == []


def test_equal_priorities_preempt_the_latest_arrival_first():
    sched = make_scheduler(num_blocks=6, budget=64, max_seqs=4, caching=False)
    old, new = seq(1, priority=3), seq(2, priority=3)
    sched.add(old)
    sched.add(new)
    while sched.num_preemptions == 0:
        simulate_step(sched)
    assert sched.running == [old] and sched.waiting == [new]


def test_waiting_high_priority_is_admitted_before_earlier_low_priority():
    sched = make_scheduler(num_blocks=100, budget=64, max_seqs=1)
    first_low, later_high, later_low = seq(1, priority=2), seq(2, priority=-1), seq(3, priority=2)
    for s in (first_low, later_high, later_low):
        sched.add(s)
    out = sched.schedule()
    assert [item.seq for item in out.scheduled] == [later_high]
    assert sched.waiting == [first_low, later_low]  # then arrival order within a priority


def test_waiting_high_priority_preempts_lower_priority_running_but_never_the_reverse():
    sched = make_scheduler(num_blocks=4, budget=64, max_seqs=4, caching=False)
    batch = seq(1, priority=10, length=12, max_tokens=4)  # 3 of the 4 blocks, then 4 as it decodes
    sched.add(batch)
    simulate_step(sched)
    interactive = seq(2, priority=0, length=12, max_tokens=4)
    sched.add(interactive)
    out = sched.schedule()
    assert [item.seq for item in out.scheduled] == [interactive] and out.preempted == [batch]
    assert sched.waiting == [batch] and batch.block_table == []
    interactive.num_computed_tokens += out.scheduled[0].num_new_tokens
    interactive.append_token(5)
    # the batch sequence, now waiting, cannot take the interactive one's blocks
    out = sched.schedule()
    assert [item.seq for item in out.scheduled] == [interactive] and out.preempted == []
    assert sched.running == [interactive] and sched.waiting == [batch]


def test_a_waiting_sequence_preempts_nothing_when_that_would_not_make_room():
    sched = make_scheduler(num_blocks=6, budget=64, max_seqs=4, caching=False)
    same, low = seq(1, priority=0, length=8, max_tokens=4), seq(2, priority=10, length=4, max_tokens=4)
    sched.add(same)
    sched.add(low)
    simulate_step(sched)  # 3 blocks taken; the decodes below take 2 more
    high = seq(3, priority=0, length=16, max_tokens=4)  # 4 blocks: 1 free + low's 2 are not enough
    sched.add(high)
    out = sched.schedule()
    assert out.preempted == [] and {item.seq for item in out.scheduled} == {same, low}
    assert sched.waiting == [high] and sched.num_preemptions == 0


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_priority_is_accepted_on_both_endpoints(server, endpoint):
    base = {"model": "fake", "max_tokens": 2, "priority": -3}
    body = {**base, "prompt": "abc"} if endpoint == "completions" else {**base, "messages": [
        {"role": "user", "content": "abc"}]}  # fmt: skip
    response = httpx.post(f"{server[0]}/v1/{endpoint}", json=body)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("value", ["high", 1.5, True, [1]])
def test_a_non_integer_priority_is_a_400_in_openai_shape(server, value):
    body = {"model": "fake", "prompt": "abc", "max_tokens": 2, "priority": value}
    response = httpx.post(f"{server[0]}/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "priority" and error["type"] == "invalid_request_error" and error["message"]


def test_lower_priority_prefill_gets_a_small_share_of_a_step_while_an_urgent_sequence_runs():
    sched = make_scheduler(num_blocks=200, budget=128, max_seqs=4)
    sched.lower_priority_prefill_tokens = 16
    urgent = seq(1, priority=0, length=5)
    sched.add(urgent)
    simulate_step(sched)  # its prompt: now it decodes
    batch = seq(2, priority=2, length=300)
    sched.add(batch)
    for _ in range(3):
        out = sched.schedule()
        chunks = {item.seq.seq_id: item.num_new_tokens for item in out.scheduled}
        assert chunks == {urgent.seq_id: 1, batch.seq_id: 16}  # the batch prompt: 16 tokens a step, not 127
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            if item.seq is urgent:
                urgent.append_token(3)
    sched.finish(urgent, "stop")
    out = sched.schedule()  # alone, the batch prompt takes the whole budget again
    assert [(item.seq, item.num_new_tokens) for item in out.scheduled] == [(batch, 128)]


def test_one_priority_for_all_is_never_capped():
    sched = make_scheduler(num_blocks=200, budget=128, max_seqs=4)
    sched.lower_priority_prefill_tokens = 16
    first, second = seq(1, priority=1, length=5), seq(2, priority=1, length=300)
    sched.add(first)
    simulate_step(sched)
    sched.add(second)
    out = sched.schedule()
    assert {item.seq.seq_id: item.num_new_tokens for item in out.scheduled} == {
        first.seq_id: 1,
        second.seq_id: 127,
    }
