"""Asynchronous decode (pipeline.py): decode steps launched before the host has seen the last tokens give
the same outputs, stops, usage and prefix-cache entries as the plain loop, through joins, aborts and stops."""

import pytest
from test_engine_serving_fakes import FakeDetokenizer, FakeRunner, fake_probs, next_token

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.device_sampler import DeviceSampler
from backends.local_engine.engine.llm_engine import LLMEngine
from backends.local_engine.engine.sampling_params import SamplingParams


def engine(async_decode: bool, **settings) -> tuple[LLMEngine, FakeRunner]:
    runner = FakeRunner(num_blocks=64, device_input=True)
    sampler = DeviceSampler(0)
    fields = {"max_model_len": 256, "max_num_batched_tokens": 64, "max_num_seqs": 8, **settings}
    config = EngineSettings(async_decode=async_decode, **fields)
    return LLMEngine(
        config, runner, fake_probs, FakeDetokenizer, sampler.sample, sampler.sample_async
    ), runner


def run(
    llm: LLMEngine, plan: dict[int, list[tuple[list[int], SamplingParams]]], aborts: dict[int, int]
) -> dict:
    """Steps the engine; `plan[step]` requests join at that step, `aborts[step]` is the i-th request aborted."""
    ids: list[int] = []
    outputs: dict[int, dict] = {}
    step = 0
    while llm.has_work or step <= max(plan, default=0):
        for prompt, params in plan.get(step, []):
            ids.append(llm.add_request(prompt, params))
            outputs[ids[-1]] = {"tokens": [], "text": "", "finish": None, "usage": None}
        if step in aborts:
            llm.abort(ids[aborts[step]])
        for out in llm.step():
            record = outputs[out.seq_id]
            record["tokens"] += out.new_token_ids
            record["text"] += out.new_text
            if out.finish_reason is not None:
                record["finish"], record["usage"] = out.finish_reason, out.num_output_tokens
        step += 1
        assert step < 500
    return outputs


PLAN = {
    0: [([7, 8, 9], SamplingParams(max_tokens=9, temperature=0.0)),
        (list(range(1, 20)), SamplingParams(max_tokens=4, temperature=0.0))],
    5: [([3, 3], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[9]))],
    8: [([5], SamplingParams(max_tokens=20, temperature=0.0, stop=["<12>"]))],
    9: [([2, 4, 6, 8], SamplingParams(max_tokens=30, temperature=0.0))],
}  # fmt: skip


@pytest.mark.parametrize("aborts", [{}, {12: 4}])
def test_async_decode_matches_the_plain_loop(aborts: dict[int, int]) -> None:
    plain, _ = engine(False)
    fast, runner = engine(True)
    expected, got = list(run(plain, PLAN, aborts).values()), list(run(fast, PLAN, aborts).values())
    for index in aborts.values():  # tokens reach the host a step later: an abort may cut one more
        aborted, reference = got.pop(index), expected.pop(index)
        assert (
            aborted["finish"] is None and reference["tokens"][: len(aborted["tokens"])] == aborted["tokens"]
        )
        assert len(aborted["tokens"]) >= len(reference["tokens"]) - 1
    assert got == expected
    assert runner.device_input_steps > 10  # most decode steps ran from device tokens
    first = expected[0]
    tokens = [7, 8, 9]
    for _ in range(9):
        tokens.append(next_token(tokens))
    assert first["tokens"] == tokens[3:] and first["usage"] == 9 and first["finish"] == "length"


def test_async_decode_registers_prefix_blocks_with_the_real_tokens() -> None:
    llm, runner = engine(True)
    prompt = [7, 8, 9]
    outputs = run(llm, {0: [(prompt, SamplingParams(max_tokens=13, temperature=0.0))]}, {})
    assert runner.device_input_steps > 5
    generated = next(iter(outputs.values()))["tokens"]
    follow_up = prompt + generated  # 16 tokens = 4 full blocks, all computed and hashed
    seq_id = llm.add_request(follow_up, SamplingParams(max_tokens=1, temperature=0.0))
    first = llm.step()
    assert first[0].seq_id == seq_id and first[0].num_cached_tokens == 12  # the last block is recomputed
    assert first[0].new_token_ids == [next_token(follow_up)]


def test_async_decode_runs_while_requests_wait_for_a_slot_and_admits_them_when_one_frees() -> None:
    plan = {0: [([i + 1, i + 2], SamplingParams(max_tokens=6 + 4 * i, temperature=0.0)) for i in range(5)]}
    plain, _ = engine(False, max_num_seqs=2)
    fast, runner = engine(True, max_num_seqs=2)
    assert list(run(fast, plan, {}).values()) == list(run(plain, plan, {}).values())
    assert runner.device_input_steps > 10  # pipelined though three, then two, then one, waited


def test_a_waiting_request_that_outranks_a_running_one_stops_the_pipeline() -> None:
    llm, _ = engine(True, max_num_seqs=1)
    llm.add_request([1, 2], SamplingParams(max_tokens=30, temperature=0.0, priority=5))
    for _ in range(4):
        llm.step()
    assert not llm.scheduler.can_admit()
    urgent = llm.add_request([3, 4], SamplingParams(max_tokens=2, temperature=0.0))  # priority 0 < 5
    assert llm.scheduler.can_admit()
    finished = []
    while llm.has_work:
        finished += [out.seq_id for out in llm.step() if out.finish_reason is not None]
    assert finished[0] == urgent and llm.scheduler.num_preemptions == 1
