"""Our GGUF-built tokenizer must give exactly the ids and chat prompts of transformers' reference tokenizer."""

import os
import random

import pytest

from backends.local_engine.loading.checkpoint import TokenizerSource
from backends.local_engine.loading.loader import load_gguf, packaged_model_path
from backends.local_engine.loading.tokenizer import Tokenizer, load_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FRAGMENTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces",
    "trailing spaces   ",
    "tabs\tand\nnewlines\r\n",
    "\n\n\n",
    "          ",
    "naïve café résumé Ærøskøbing",
    "日本語のテキストと中文文本",
    "한국어 문장입니다",
    "Привет, мир! Ελληνικά",
    "مرحبا بالعالم",
    "emoji 😀🎉👩‍👩‍👧‍👦 flags 🇫🇷",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"key": [1, 2.5, null], "nested": {"a": "b"}}',
    "SELECT * FROM users WHERE id = 42;",
    "1234567890 3.14159 -273.15 1e-9",
    "don't can't we'll they're I'm",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<repo_name>",
    "<|im_start|>user\nHi<|im_end|>",
    "mixed<|im_end|>special",
    "URL: https://example.com/path?q=1&r=2#frag",
    "€ £ ¥ © ® ™ ° ± × ÷",
    "zero\u200bwidth\u00a0nbsp",
    "ALL CAPS and MiXeD cAsE",
    "a" * 40,
    "!!!???...,,,;;;",
]


def varied_strings(count: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    strings = list(FRAGMENTS)
    while len(strings) < count:
        parts = rng.choices(FRAGMENTS, k=rng.randint(2, 5))
        glue = rng.choice(["", " ", "\n", "  ", "\t"])
        text = glue.join(parts)
        if rng.random() < 0.3:
            text = "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 30))) + text
        strings.append(text)
    return strings


@pytest.fixture(scope="module")
def source() -> TokenizerSource:
    return load_gguf(packaged_model_path()).tokenizer


@pytest.fixture(scope="module")
def ours(source: TokenizerSource) -> Tokenizer:
    return load_tokenizer(source)


@pytest.fixture(scope="module")
def reference():
    transformers = pytest.importorskip("transformers")
    path = packaged_model_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_ids_match_reference_on_varied_strings(ours: Tokenizer, reference) -> None:
    strings = varied_strings(300)
    mismatches = [s for s in strings if ours.encode(s) != reference(s).input_ids]
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]!r}"


def test_decode_round_trips(ours: Tokenizer) -> None:
    for text in varied_strings(100, seed=7):
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_special_tokens_are_single_ids(ours: Tokenizer) -> None:
    assert ours.encode("<|im_end|>") == [2]
    assert ours.eos_token_ids == (2,)
    assert ours.is_special(2) and not ours.is_special(ours.encode("hello")[0])
    assert ours.decode([2] + ours.encode("hi")) == "hi"


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_reference(ours: Tokenizer, reference, messages: list[dict]) -> None:
    expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ours.apply_chat_template(messages) == expected
    assert ours.encode_chat(messages) == reference(expected).input_ids


def test_template_error_is_a_value_error(source: TokenizerSource) -> None:
    strict = TokenizerSource(
        gguf_fields=source.gguf_fields,
        chat_template="{{ raise_exception('roles must alternate') }}",
        eos_token_ids=source.eos_token_ids,
    )
    with pytest.raises(ValueError, match="roles must alternate"):
        load_tokenizer(strict).apply_chat_template([{"role": "user", "content": "x"}])


def test_tokenizer_json_folder(ours: Tokenizer, tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(ours.backend.to_str())
    from_json = load_tokenizer(TokenizerSource(tokenizer_json=path, eos_token_ids=(2,), bos_token_id=1))
    for text in varied_strings(50, seed=3):
        assert from_json.encode(text) == ours.encode(text)


def test_token_bytes_rebuild_the_utf8_text(ours: Tokenizer) -> None:
    for text in ["emoji 😀🎉 and 日本語", "plain words", " spaced\ttext\n"]:
        ids = ours.encode(text)
        assert b"".join(ours.token_bytes(i) for i in ids) == text.encode("utf-8")
    partial = ours.encode("😀")[0]
    assert ours.token_text(partial) == "\ufffd" and len(ours.token_bytes(partial)) < 4
    assert ours.token_bytes(2) == b"<|im_end|>"


def test_token_bytes_of_a_sentencepiece_style_vocabulary(tmp_path) -> None:
    from tokenizers import SentencePieceBPETokenizer

    backend = SentencePieceBPETokenizer()
    backend.train_from_iterator(["The lamp was lit at dusk."] * 5, vocab_size=60, show_progress=False)
    path = tmp_path / "tokenizer.json"
    backend.save(str(path))
    tokenizer = load_tokenizer(TokenizerSource(tokenizer_json=path))
    ids = tokenizer.encode("The lamp")
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == b" The lamp"
