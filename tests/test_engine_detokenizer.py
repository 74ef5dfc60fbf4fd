"""Incremental detokenization: whole characters only, stop strings spanning tokens are never emitted."""

from pathlib import Path

import pytest
from tokenizers import SentencePieceBPETokenizer

from backends.local_engine.engine.detokenizer import IncrementalDetokenizer
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.loading.loader import load_gguf, packaged_model_path
from backends.local_engine.loading.tokenizer import Tokenizer, load_tokenizer

TEXTS = [
    "Hello there, how are you today?",
    "emoji 😀🎉👩‍👩‍👧‍👦 and 日本語 and naïve café",
    "def f(x):\n    return x  # done\n",
    "   spaced    out   ",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_tokenizer(load_gguf(packaged_model_path()).tokenizer)


def stream(
    tokenizer: Tokenizer, text: str, stop: list[str], **options: object
) -> tuple[list[str], IncrementalDetokenizer]:
    prompt = tokenizer.encode("Answer:")
    detok = IncrementalDetokenizer(tokenizer, prompt, SamplingParams(stop=stop, **options))
    pieces = []
    for token_id in tokenizer.encode(text):
        pieces.append(detok.add(token_id))
        if detok.stopped:
            break
    return pieces, detok


@pytest.mark.parametrize("text", TEXTS)
def test_stream_reassembles_the_text_without_broken_characters(tokenizer: Tokenizer, text: str) -> None:
    pieces, detok = stream(tokenizer, text, stop=[])
    assert "".join(pieces) + detok.flush() == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_multibyte_character_split_over_tokens_waits(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("😀")
    assert len(ids) > 1  # the emoji is spelled with several byte tokens
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams())
    assert [detok.add(i) for i in ids] == [""] * (len(ids) - 1) + ["😀"]


def test_stop_string_spanning_tokens_is_cut_and_never_emitted(tokenizer: Tokenizer) -> None:
    text = "The answer is 42. STOP HERE and more text"
    pieces, detok = stream(tokenizer, text, stop=["STOP HERE"])
    assert detok.stopped
    assert "".join(pieces) == "The answer is 42. "
    assert not any("STOP" in piece or piece.endswith("ST") for piece in pieces)
    assert detok.add(tokenizer.encode(" x")[0]) == "" and detok.flush() == ""


def test_partial_stop_prefix_is_released_when_it_turns_out_not_to_be_a_stop(tokenizer: Tokenizer) -> None:
    pieces, detok = stream(tokenizer, "a STOP-like STOPPER word", stop=["STOP!"])
    assert not detok.stopped
    assert "".join(pieces) + detok.flush() == "a STOP-like STOPPER word"


def test_earliest_of_several_stop_strings_wins(tokenizer: Tokenizer) -> None:
    pieces, detok = stream(tokenizer, "one, two; three", stop=["three", ";"])
    assert detok.stopped and "".join(pieces) == "one, two"
    assert detok.stop_string == ";"  # vLLM's stop_reason: the string that matched


def test_the_stop_string_spanning_tokens_is_remembered(tokenizer: Tokenizer) -> None:
    _, detok = stream(tokenizer, "The answer is 42. STOP HERE and more text", stop=["nope", "STOP HERE"])
    assert detok.stop_string == "STOP HERE"
    _, unstopped = stream(tokenizer, "no stop at all", stop=["STOP"])
    assert unstopped.stop_string is None


def test_special_tokens_are_skipped(tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams())
    text = "".join(detok.add(i) for i in [*tokenizer.encode("Hi"), 2])
    assert text + detok.flush() == "Hi"


def test_sentencepiece_style_word_starts_follow_the_prompt() -> None:
    """Metaspace tokenizers drop a sequence-initial space when decoding alone; the stream must not."""
    backend = SentencePieceBPETokenizer()
    text = (Path(__file__).parent / "data" / "quality_text.txt").read_text()
    backend.train_from_iterator(text.splitlines(), vocab_size=400, show_progress=False)
    prompt, output = backend.encode("Answer:").ids, backend.encode("The keeper lit the lamp.").ids
    detok = IncrementalDetokenizer(backend, prompt, SamplingParams())
    streamed = "".join(detok.add(i) for i in output) + detok.flush()
    expected = backend.decode(prompt + output)[len(backend.decode(prompt)) :]
    assert streamed == expected == " The keeper lit the lamp."


def test_stop_string_is_kept_when_asked(tokenizer: Tokenizer) -> None:
    pieces, detok = stream(
        tokenizer, "The answer is 42. STOP HERE and more", ["STOP HERE"], include_stop_str_in_output=True
    )
    assert detok.stopped and "".join(pieces) == "The answer is 42. STOP HERE"


def test_stop_strings_count_only_from_min_tokens_on(tokenizer: Tokenizer) -> None:
    text = "x. y. z. w"
    first_stop = len(tokenizer.encode("x."))
    pieces, detok = stream(tokenizer, text, ["."], min_tokens=first_stop + 1)
    assert detok.stopped and "".join(pieces) == "x. y"


def test_special_tokens_are_left_out_unless_asked(tokenizer: Tokenizer) -> None:
    eos = tokenizer.encode("<|im_end|>")
    assert len(eos) == 1  # one special token
    for skip, expected in ((True, "hi"), (False, "hi<|im_end|>")):
        detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(skip_special_tokens=skip))
        text = "".join(detok.add(t) for t in tokenizer.encode("hi") + eos) + detok.flush()
        assert text == expected
