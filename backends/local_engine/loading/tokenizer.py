"""Text ↔ token ids with the `tokenizers` library, built from GGUF metadata or a tokenizer.json.

GGUF files carry no tokenizer.json: for byte-level BPE vocabularies ("gpt2" in llama.cpp's terms,
used by SmolLM, Llama 3 and Qwen2) we rebuild it from the vocabulary, the merges, the token types
(control tokens become special tokens) and the pre-tokenizer name, the way transformers does, so both
produce the same ids.
"""

import re
from functools import cache
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from backends.local_engine.loading.chat_template import ChatTemplate
from backends.local_engine.loading.checkpoint import TokenizerSource

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


class Tokenizer:
    def __init__(self, backend: Backend, source: TokenizerSource, add_bos: bool = False) -> None:
        self.backend = backend
        self.bos_token_id = source.bos_token_id
        self.eos_token_ids = source.eos_token_ids
        self.add_bos = add_bos and source.bos_token_id is not None
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.byte_level = backend.decoder is not None and b"ByteLevel" in backend.decoder.__getstate__()
        self.chat_template = ChatTemplate(source.chat_template, self._token(self.bos_token_id), self._eos())

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`; special-token strings in it (e.g. "<|im_end|>") map to their single ids."""
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token's text as it would be printed (a partial UTF-8 character shows as '\ufffd')."""
        return self.backend.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (OpenAI logprobs' `bytes`), also for a partial UTF-8 character."""
        token = self.backend.id_to_token(token_id) or ""
        if self.is_special(token_id):
            return token.encode("utf-8")
        if _BYTE_FALLBACK.fullmatch(token):  # sentencepiece byte fallback: <0xE2>
            return bytes([int(token[3:5], 16)])
        if self.byte_level and set(token) <= _byte_alphabet():
            decoder = _unicode_to_bytes()
            return bytes(decoder[char] for char in token)
        return token.replace("▁", " ").encode("utf-8")

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids()

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **options: Any
    ) -> str:
        """`options`: ChatTemplate.render's continue_final_message and template_kwargs."""
        return self.chat_template.render(messages, add_generation_prompt, **options)

    def encode_chat(self, messages: list[dict[str, Any]], **options: Any) -> list[int]:
        """Prompt ids for a chat; the template writes any BOS itself."""
        return self.backend.encode(
            self.apply_chat_template(messages, **options), add_special_tokens=False
        ).ids

    def _token(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.backend.id_to_token(token_id) or "")

    def _eos(self) -> str:
        return self._token(self.eos_token_ids[0]) if self.eos_token_ids else ""

    def _special_ids(self) -> frozenset[int]:
        if not hasattr(self, "_special"):
            added = self.backend.get_added_tokens_decoder()
            self._special = frozenset(i for i, token in added.items() if token.special)
        return self._special


def load_tokenizer(source: TokenizerSource) -> Tokenizer:
    if source.tokenizer_json is not None:
        return Tokenizer(Backend.from_file(str(source.tokenizer_json)), source)
    fields = source.gguf_fields
    if fields.get("model") == "llama":  # SentencePiece (Gemma)
        from backends.local_engine.loading.gemma3_tokenizer import sentencepiece_backend

        return Tokenizer(sentencepiece_backend(fields), source, add_bos=bool(fields.get("add_bos_token")))
    if fields.get("model") != "gpt2":
        raise ValueError(f"GGUF tokenizer {fields.get('model')!r} is not supported (byte-level BPE only)")
    return Tokenizer(byte_level_backend(fields), source, add_bos=bool(fields.get("add_bos_token")))


def byte_level_backend(fields: dict[str, Any]) -> Backend:
    tokens: list[str] = list(fields["tokens"])
    vocab = {_byte_level_spelling(token): index for index, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ", 1)) for merge in fields["merges"]]
    backend = Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(fields.get("pre"))
    backend.decoder = decoders.ByteLevel()
    _add_marked_tokens(backend, tokens, fields.get("token_type") or [])
    return backend


def _pre_tokenizer(name: str | None) -> pre_tokenizers.PreTokenizer:
    split = _SPLITS.get(name or "")
    if split is None:  # GPT-2's own regex (SmolLM, StarCoder, ...)
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _add_marked_tokens(backend: Backend, tokens: list[str], token_types: list[int]) -> None:
    """Control tokens (e.g. <|im_end|>) become special tokens, user-defined ones plain added tokens.

    A "control" token spelled outside the byte alphabet is a llama.cpp mislabel and is skipped.
    """
    alphabet = _byte_alphabet()
    marked = list(zip(tokens, token_types, strict=False))
    control = [token for token, kind in marked if kind == _CONTROL and set(token) <= alphabet]
    user = [token for token, kind in marked if kind == _USER_DEFINED]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _byte_level_spelling(token: str) -> str:
    """GGUF stores byte-level tokens spelled in GPT-2's byte alphabet, except a few raw ones."""
    if set(token) <= _byte_alphabet():
        return token
    spelling = _bytes_to_unicode()
    return "".join(spelling[byte] for byte in token.encode("utf-8"))


@cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte], extra = chr(256 + extra), extra + 1
    return mapping


@cache
def _unicode_to_bytes() -> dict[str, int]:
    return {char: byte for byte, char in _bytes_to_unicode().items()}


@cache
def _byte_alphabet() -> frozenset[str]:
    return frozenset(_bytes_to_unicode().values())
