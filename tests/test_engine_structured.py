"""Structured outputs in our engine on the real SmolLM2: response_format JSON always parses and validates,
with and without speculative decoding, and the constraint follows rolled-back drafts."""

import json
import os

import jsonschema
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("llguidance")

from backends.local_engine.config import EngineSettings  # noqa: E402
from backends.local_engine.engine.detokenizer import IncrementalDetokenizer  # noqa: E402
from backends.local_engine.engine.llm_engine import LLMEngine  # noqa: E402
from backends.local_engine.engine.sampler import probabilities  # noqa: E402
from backends.local_engine.engine.structured import grammars_for  # noqa: E402
from backends.local_engine.server.protocol import sampling_params  # noqa: E402
from core.errors import OpenAIError  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}, "city": {"enum": ["Paris", "Oslo"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module")
def runner():
    from backends.local_engine.engine.model_runner import ModelRunner

    return ModelRunner(EngineSettings(dtype="fp32", kv_cache_memory_mb=64, max_model_len=512))


@pytest.fixture(scope="module")
def grammars(runner):
    return grammars_for(runner.tokenizer)


def generate(runner, grammars, body: dict, **engine: object) -> str:
    settings = EngineSettings(max_model_len=512, max_num_batched_tokens=128, max_num_seqs=4, **engine)
    llm = LLMEngine(
        settings, runner, probabilities, lambda p, params: IncrementalDetokenizer(runner.tokenizer, p, params)
    )
    params = sampling_params("chat", {"temperature": 0, "max_tokens": 80, **body}, 80, grammars)
    seq_id = llm.add_request(runner.tokenizer.encode_chat(body["messages"]), params)
    text, finish = "", None
    while llm.has_work:
        for out in llm.step():
            assert out.seq_id == seq_id
            text, finish = text + out.new_text, out.finish_reason or finish
    assert finish == "stop", (finish, text)
    return text


def test_json_schema_output_parses_and_validates_with_speculation(runner, grammars) -> None:
    body = {"messages": [{"role": "user", "content": "Describe a person who lives in Oslo."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}  # fmt: skip
    text = generate(runner, grammars, body, speculative_ngram=True, num_speculative_tokens=3)
    jsonschema.validate(json.loads(text), PERSON)


def test_the_constraint_follows_rollbacks(runner, grammars) -> None:
    import torch

    constraint = grammars.for_response_format({"type": "json_object"})  # any object (json_object mode)
    ids = runner.tokenizer.encode('{"a": 1}', add_special_tokens=False)
    vocab = (
        runner.config.vocab_size if hasattr(runner.config, "vocab_size") else grammars.tokenizer().vocab_size
    )
    for length in [len(ids), 1, len(ids) - 1, 0, len(ids)]:  # forward, back, forward, reset, forward
        logits = torch.zeros(vocab)
        constraint.mask(logits, ids[:length])
        if length < len(ids):
            assert logits[ids[length]] == 0  # the next token of valid JSON stays allowed
    assert torch.isinf(logits).sum() == vocab - 1  # the object is complete: only EOS is left


def test_unfollowable_schema_is_a_400(grammars) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 3}}}
    with pytest.raises(OpenAIError) as error:
        sampling_params("chat", {"messages": [], "response_format": bad}, 8, grammars)
    assert error.value.status == 400 and error.value.param == "response_format"
