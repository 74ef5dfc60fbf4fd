"""Gemma's SentencePiece tokenizer (tokenizer.ggml.model == "llama": BPE with byte fallback) rebuilt with
the `tokenizers` library from the GGUF vocabulary, as transformers' GGUF loader does for Gemma:

- a token made of two or more spaces is stored as real spaces but looked up as "▁▁…": respelled;
- the file lists no merges: every split of a token into two vocabulary pieces is a merge, ranked by the
  token's position in the file (Gemma's scores do not follow its merge order; the file order does);
- spaces become "▁" (no prefix space), byte-fallback tokens <0x..> decode to bytes;
- control tokens (<bos>, <start_of_turn>, ...) are special, user-defined ones plain added tokens.
tests/test_gemma3.py checks the ids against transformers' tokenizer on the same file.
"""

from typing import Any

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_SPACE = "\u2581"


def sentencepiece_backend(fields: dict[str, Any]) -> Backend:
    tokens = [_SPACE * len(t) if " " in t and not t.strip() else t for t in fields["tokens"]]
    vocab = {token: index for index, token in enumerate(tokens)}
    unknown = tokens[int(fields.get("unknown_token_id") or 3)] if len(tokens) > 3 else None
    backend = Backend(models.BPE(vocab=vocab, merges=derived_merges(vocab), fuse_unk=True, unk_token=unknown,
                                 byte_fallback=True))  # fmt: skip
    backend.normalizer = normalizers.Replace(" ", _SPACE)
    backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    backend.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    marked = list(zip(tokens, fields.get("token_type") or [], strict=False))
    backend.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t, k in marked if k == _CONTROL]
    )
    backend.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t, k in marked if k == _USER_DEFINED]
    )
    return backend


def derived_merges(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """All (left, right) splits of each token into two vocabulary entries, earliest token first; among a
    token's splits, longer left pieces first (transformers' `generate_merges` with position scores)."""
    ranked: list[tuple[int, int, int, str, str]] = []
    for token, index in vocab.items():
        splits = [(token[:cut], token[cut:]) for cut in range(1, len(token))]
        local = sorted((vocab[a], vocab[b], a, b) for a, b in splits if a in vocab and b in vocab)
        ranked += [(index, -len(a), -len(b), a, b) for _, _, a, b in local]
    ranked.sort(key=lambda item: item[:3])
    return [(a, b) for *_, a, b in ranked]
