"""The synchronous engine loop against a deterministic fake runner (no model weights)."""

import pytest
from test_engine_serving_fakes import EOS, FakeDetokenizer, FakeRunner, fake_probs, next_token

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.llm_engine import LLMEngine
from backends.local_engine.engine.sampling_params import SamplingParams


def make_engine(num_blocks: int = 64, **overrides) -> tuple[LLMEngine, FakeRunner]:
    settings = EngineSettings(max_model_len=256, max_num_batched_tokens=32, max_num_seqs=8, **overrides)
    runner = FakeRunner(num_blocks=num_blocks)
    return LLMEngine(settings, runner, fake_probs, FakeDetokenizer), runner


def expected_continuation(prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


def run_all(engine: LLMEngine, requests: dict[int, list[int]]) -> dict[int, list[int]]:
    outputs: dict[int, list[int]] = {seq_id: [] for seq_id in requests}
    while engine.has_work:
        for out in engine.step():
            outputs[out.seq_id] += out.new_token_ids
    return outputs


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kwargs)


def test_greedy_outputs_follow_the_model():
    engine, _ = make_engine()
    prompts = [[7, 8, 9], list(range(1, 40)), [3] * 20]
    ids = {engine.add_request(p, greedy(12)): p for p in prompts}
    outputs = run_all(engine, ids)
    for seq_id, prompt in ids.items():
        assert outputs[seq_id] == expected_continuation(prompt, 12)
    assert engine.block_manager.num_free_blocks == 64


def test_tiny_kv_pool_preempts_and_still_matches():
    prompts = [list(range(i, i + 10 + 3 * i)) for i in range(1, 9)]
    small, _ = make_engine(num_blocks=24)
    large, _ = make_engine(num_blocks=400)
    small_ids = {small.add_request(p, greedy(30)): p for p in prompts}
    large_ids = {large.add_request(p, greedy(30)): p for p in prompts}
    small_out, large_out = run_all(small, small_ids), run_all(large, large_ids)
    assert small.scheduler.num_preemptions > 0
    assert list(small_out.values()) == list(large_out.values())


def test_speculation_gives_identical_greedy_output_with_fewer_steps():
    plain, plain_runner = make_engine()
    spec, spec_runner = make_engine(speculative_ngram=True, num_speculative_tokens=4)
    prompt = [5, 6, 7, 8]
    plain_out = run_all(plain, {plain.add_request(prompt, greedy(60)): prompt})
    spec_out = run_all(spec, {spec.add_request(prompt, greedy(60)): prompt})
    assert list(plain_out.values()) == list(spec_out.values())
    assert spec.counters.num_accepted_tokens > 0
    assert len(spec_runner.batches) < len(plain_runner.batches) / 2


def test_speculation_with_sampling_finishes_with_exact_length():
    spec, _ = make_engine(speculative_ngram=True)
    ids = {
        spec.add_request(
            [1, 2, 3], SamplingParams(max_tokens=40, temperature=0.8, seed=s, ignore_eos=True)
        ): s
        for s in range(4)
    }
    outputs = run_all(spec, ids)
    assert all(len(tokens) == 40 for tokens in outputs.values())
    assert spec.block_manager.num_free_blocks == 64


def test_seeded_sampling_is_reproducible():
    outs = []
    for _ in range(2):
        engine, _ = make_engine()
        seq_id = engine.add_request([1, 2, 3], SamplingParams(max_tokens=20, temperature=1.5, seed=42))
        outs.append(run_all(engine, {seq_id: []})[seq_id])
    assert outs[0] == outs[1]


def test_stop_conditions():
    engine, _ = make_engine()
    prompt = [4]
    continuation = expected_continuation(prompt, 10)
    by_token = engine.add_request(prompt, greedy(10, stop_token_ids=[continuation[3]]))
    by_string = engine.add_request(prompt, greedy(10, stop=[f"<{continuation[2]}>"]))
    finals = {}
    while engine.has_work:
        for out in engine.step():
            finals.setdefault(out.seq_id, []).append(out)
    assert sum(len(o.new_token_ids) for o in finals[by_token]) == 4
    assert finals[by_token][-1].finish_reason == "stop"
    text = "".join(o.new_text for o in finals[by_string])
    assert text == "".join(f"<{t}>" for t in continuation[:2])
    assert engine.block_manager.num_free_blocks == 64


def test_eos_stops_unless_ignored():
    engine, runner = make_engine()
    runner._row = lambda context: (
        __import__("torch").nn.functional.one_hot(__import__("torch").tensor(EOS), 64).float()
    )
    stopped = engine.add_request([1], greedy(5))
    ignored = engine.add_request([1], greedy(5, ignore_eos=True))
    outputs = run_all(engine, {stopped: [], ignored: []})
    assert outputs[stopped] == [EOS] and outputs[ignored] == [EOS] * 5


def test_prompt_too_long_is_refused_with_a_clear_message():
    engine, _ = make_engine()
    with pytest.raises(ValueError, match="maximum context length is 256 tokens"):
        engine.add_request(list(range(300)), greedy(5))


def test_abort_frees_blocks_and_drops_the_request():
    engine, _ = make_engine()
    seq_id = engine.add_request(list(range(1, 30)), greedy(50))
    engine.step()
    assert engine.block_manager.num_free_blocks < 64
    engine.abort(seq_id)
    assert engine.block_manager.num_free_blocks == 64 and not engine.has_work


def test_logprobs_are_reported_per_token():
    engine, _ = make_engine()
    seq_id = engine.add_request([1, 2], greedy(3, logprobs=True, top_logprobs=2))
    outs = [o for o in iter(engine.step, []) if o]
    logprobs = [lp for step in outs for o in step if o.seq_id == seq_id for lp in o.new_logprobs]
    assert len(logprobs) == 3
    assert all(lp.logprob < 0 and len(lp.top) == 2 and lp.top[0][0] == lp.token_id for lp in logprobs)
