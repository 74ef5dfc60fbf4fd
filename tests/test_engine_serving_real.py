"""The serving loop on the real SmolLM2 weights: speculation, prefix caching and preemption are exact."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")

from backends.local_engine.config import EngineSettings  # noqa: E402
from backends.local_engine.engine.detokenizer import IncrementalDetokenizer  # noqa: E402
from backends.local_engine.engine.llm_engine import LLMEngine  # noqa: E402
from backends.local_engine.engine.sampler import probabilities  # noqa: E402
from backends.local_engine.engine.sampling_params import SamplingParams  # noqa: E402

SYSTEM = (
    "You are a careful assistant for a hardware store. Answer in one short sentence. Prices: hammer 12 "
    "dollars, saw 25 dollars, drill 80 dollars, box of nails 4 dollars, tape measure 9 dollars."
)
CODE = "def area(width, height):\n    return width * height\n\ndef perimeter(width, height):\n"


@pytest.fixture(scope="module")
def runner():
    from backends.local_engine.engine.model_runner import ModelRunner

    # fp32: int8 rounds activations to ~14 bits per row, which turns the float noise of different
    # attention paddings (prefix cache hit vs full prefill) into near-tie argmax flips
    return ModelRunner(EngineSettings(dtype="fp32", kv_cache_memory_mb=64, max_model_len=512))


class SmallPool:
    """The same runner, with the block manager told about only the first `num_blocks` blocks."""

    def __init__(self, runner, num_blocks: int) -> None:
        self._runner, self.num_blocks = runner, num_blocks

    def __getattr__(self, name: str):
        return getattr(self._runner, name)


def make_engine(runner, **overrides) -> LLMEngine:
    defaults = {"max_model_len": 512, "max_num_batched_tokens": 64, "max_num_seqs": 8}
    settings = EngineSettings(**(defaults | overrides))
    return LLMEngine(
        settings, runner, probabilities, lambda p, params: IncrementalDetokenizer(runner.tokenizer, p, params)
    )


def chat(runner, system: str, user: str) -> list[int]:
    return runner.tokenizer.encode_chat(
        [{"role": "system", "content": system}, {"role": "user", "content": user}]
    )


def run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 24) -> list[list[int]]:
    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0.0)) for p in prompts]
    outputs = {i: [] for i in ids}
    while engine.has_work:
        for out in engine.step():
            outputs[out.seq_id] += out.new_token_ids
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [outputs[i] for i in ids]


SPEC_PROMPTS = [  # code, prose, a list: echoed text accepts most drafts, free text few
    ("Repeat the user's text exactly.", CODE * 2),
    ("Complete the code.", "def factorial(n):\n    # return n! for n >= 0, recursively\n"),
    ("You write short stories.", "Tell a story about a lighthouse keeper and a storm."),
    (
        "Repeat the user's text exactly.",
        "The river rose in spring. The river fell in autumn. The river rose.",
    ),
    ("Answer with a numbered list.", "List five fruits and their colours."),
    ("Repeat the list.", "1. apples\n2. pears\n3. plums\n4. apples\n5. pears"),
]


def test_speculative_greedy_output_is_identical_on_code_prose_and_lists(runner):
    prompts = [chat(runner, system, user) for system, user in SPEC_PROMPTS]
    plain = run(make_engine(runner), prompts, 48)
    spec = make_engine(runner, speculative_ngram=True, num_speculative_tokens=4, spec_min_acceptance=0.0)
    assert run(spec, prompts, 48) == plain
    assert spec.counters.num_accepted_tokens > 0
    gated = make_engine(runner, speculative_ngram=True, num_speculative_tokens=4)
    assert run(gated, prompts, 48) == plain
    # free text rejects most drafts: the acceptance gate proposes fewer of them
    assert gated.counters.num_draft_tokens < spec.counters.num_draft_tokens


@pytest.fixture(scope="module")
def int4_runner():
    from backends.local_engine.engine.model_runner import ModelRunner

    runner = ModelRunner(EngineSettings(dtype="int4", kv_cache_memory_mb=64, max_model_len=512))
    if runner.cpu_decoder is None:
        pytest.skip("the one-call CPU step (AVX2 kernels) is not used on this machine")
    return runner


def test_speculative_greedy_output_is_identical_with_the_default_int4_cpu_step(int4_runner):
    """The default format: every row's arithmetic is fixed (cpu_decode.py), so drafts verified in a span,
    and prompts chunked differently around them, leave greedy output unchanged."""
    prompts = [chat(int4_runner, system, user) for system, user in SPEC_PROMPTS]
    plain = run(make_engine(int4_runner), prompts, 48)
    spec = make_engine(int4_runner, speculative_ngram=True, num_speculative_tokens=4, spec_min_acceptance=0.0)
    assert run(spec, prompts, 48) == plain
    assert spec.counters.num_accepted_tokens > 0
    unchunked = make_engine(int4_runner, max_num_batched_tokens=512)
    assert run(unchunked, prompts, 48) == plain


def test_shared_system_prompt_hits_the_prefix_cache_with_identical_outputs(runner):
    questions = ["How much is a saw?", "What costs 4 dollars?", "Price of a drill?"]
    prompts = [chat(runner, SYSTEM, q) for q in questions]
    cached = make_engine(runner)
    first = run(cached, prompts[:1])
    rest = run(cached, prompts[1:])
    assert cached.block_manager.stats.hits >= 2 * 32
    uncached = make_engine(runner, enable_prefix_caching=False)
    assert first + rest == run(uncached, prompts)


def test_tiny_kv_pool_preempts_with_identical_outputs(runner):
    prompts = [chat(runner, SYSTEM, f"Question {i}: what is {i} + {i}?") for i in range(4)]
    unconstrained = run(make_engine(runner), prompts, 32)
    longest = max(len(p) for p in prompts) + 32
    tiny = make_engine(SmallPool(runner, num_blocks=-(-longest // runner.block_size) + 2))
    assert run(tiny, prompts, 32) == unconstrained
    assert tiny.scheduler.num_preemptions > 0
