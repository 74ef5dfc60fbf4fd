"""Incremental detokenization with stop strings, for streaming one request's output.

Text is released only once it is final:
- a token that ends inside a multi-byte UTF-8 character decodes to '\ufffd'; we wait for the next tokens
  (decoding a short window of previous tokens too, so word-initial spaces come out right for every
  tokenizer family);
- text that could be the start of a stop string is held back until it is clear it is not one; when a stop
  string appears (even spread over several tokens), the text is cut before it (after it with
  `include_stop_str_in_output`) and `stopped` is set; stop strings count only from `min_tokens` tokens on.
"""

from typing import Protocol

from backends.local_engine.engine.sampling_params import SamplingParams

_CONTEXT_TOKENS = 5  # previous tokens decoded together with new ones
_MAX_PENDING = 6  # a UTF-8 character spans at most 4 byte tokens; give up waiting after this many


class TextDecoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: TextDecoder, prompt_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.include_stop = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        self.added = 0  # output tokens seen
        self.ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop_strings = [s for s in params.stop if s]
        self.text = ""  # the output so far, cut before a stop string
        self.released = 0  # characters of `text` already returned
        self.stopped = False
        self.stop_string: str | None = None  # the stop string that ended the text

    def add(self, token_id: int) -> str:
        """The newly final text after appending `token_id` ('' while waiting)."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        self.added += 1
        self.text += self._new_text()
        return self._release()

    def flush(self) -> str:
        """At the end of generation: everything still held back (a partial stop string, pending bytes)."""
        if self.stopped:
            return ""
        self.text += self._decode(self.ids[self.read_offset :]) if self.read_offset < len(self.ids) else ""
        self.read_offset = len(self.ids)
        tail = self.text[self.released :]
        self.released = len(self.text)
        return tail

    def _new_text(self) -> str:
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        pending = len(self.ids) - self.read_offset
        if len(after) <= len(before) or (after.endswith("\ufffd") and pending < _MAX_PENDING):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before) :]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _release(self) -> str:
        found = self._stop_position() if self.added >= self.min_tokens else None
        if found is not None:
            cut, self.stop_string = found
            self.text, self.stopped = self.text[:cut], True
            end = len(self.text)
        else:
            end = len(self.text) - self._held_back()
        released, self.released = self.text[self.released : end], max(self.released, end)
        return released

    def _stop_position(self) -> tuple[int, str] | None:
        """Where the text ends at the first stop string (before it, or after it when it is kept), and which."""
        found = [(i, len(s), s) for s in self.stop_strings if (i := self.text.find(s, self.released)) >= 0]
        if not found:
            return None
        start, length, stop = min(found)
        return (start + length if self.include_stop else start), stop

    def _held_back(self) -> int:
        """Length of the longest tail of `text` that a stop string starts with."""
        tail_lengths = (
            n
            for stop in self.stop_strings
            for n in range(min(len(stop) - 1, len(self.text)), 0, -1)
            if stop.startswith(self.text[-n:])
        )
        return max(tail_lengths, default=0)
