"""OpenAI request bodies in, OpenAI response objects out: the engine server's wire format.

Bodies are validated by the gateway's own OpenAI checks first; this module turns them into sampling
parameters and builds completions, chat completions and their streaming chunks.
"""

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from backends.local_engine.engine.outputs import RequestOutput, TokenLogprob
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.server.prompts import Prompt
from backends.local_engine.server.refusals import JSON_MODES, refuse_what_cannot_be_honoured
from backends.local_engine.server.tools import ToolRequest, tool_request
from core.completion import requested_completion_tokens
from core.errors import bad_request

TokenText = Callable[[int], str]


def sampling_params(
    endpoint: str, body: dict[str, Any], max_tokens_when_unset: int, grammars: Any = None
) -> SamplingParams:
    """`grammars`: a structured.Grammars for this model's tokenizer, which makes JSON response formats possible."""
    refuse_what_cannot_be_honoured(body, json_modes=grammars is not None)
    tools = tool_request(body) if endpoint == "chat" else None
    stop = body.get("stop") or []
    min_tokens = body.get("min_tokens") or 0
    max_tokens = requested_completion_tokens(body)
    if max_tokens is None:  # not given: enough for min_tokens (an explicit smaller one is a 400)
        max_tokens = max(max_tokens_when_unset, min_tokens)
    top_k = body.get("top_k") or 0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=body.get("temperature", 1.0),
        top_p=body.get("top_p", 1.0),
        top_k=0 if top_k == -1 else top_k,  # vLLM's -1 and 0 both mean off
        min_p=body.get("min_p", 0.0),
        presence_penalty=body.get("presence_penalty", 0.0),
        frequency_penalty=body.get("frequency_penalty", 0.0),
        repetition_penalty=body.get("repetition_penalty", 1.0),
        seed=body.get("seed"),
        stop=[stop] if isinstance(stop, str) else list(stop),
        stop_token_ids=_listed(body.get("stop_token_ids")),
        ignore_eos=bool(body.get("ignore_eos", False)),
        min_tokens=min_tokens,
        include_stop_str_in_output=bool(body.get("include_stop_str_in_output", False)),
        skip_special_tokens=body.get("skip_special_tokens", True) is not False,
        prompt_logprobs=body.get("logprobs") if endpoint == "completions" and body.get("echo") else None,
        logit_bias={int(token): float(bias) for token, bias in (body.get("logit_bias") or {}).items()},
        priority=body.get("priority", 0),
        constraint=_constraint(body, tools, grammars),
        **_logprob_options(endpoint, body),
    )


def _listed(value: Any) -> Any:
    """An array as a list; anything else as it came, for request_checks to refuse by name."""
    return list(value) if isinstance(value, list | tuple) else ([] if value is None else value)


def choice_params(
    endpoint: str, body: dict[str, Any], max_tokens_when_unset: int, grammars: Any = None
) -> list[SamplingParams]:
    """The sampling parameters of each of the request's n choices. A seeded request's choices take seeds seed,
    seed + 1, ..., so they differ from each other and each is reproducible; a grammar-constrained choice gets
    its own matcher, which keeps the state of its own answer."""
    first = sampling_params(endpoint, body, max_tokens_when_unset, grammars)
    choices = [first]
    for index in range(1, body.get("n") or 1):
        params = (
            first
            if first.constraint is None
            else sampling_params(endpoint, body, max_tokens_when_unset, grammars)
        )
        choices.append(replace(params, seed=None if first.seed is None else first.seed + index))
    return choices


def _wants_json(body: dict[str, Any]) -> bool:
    given = body.get("response_format")
    return isinstance(given, dict) and given.get("type") in JSON_MODES


def _constraint(body: dict[str, Any], tools: ToolRequest | None, grammars: Any) -> Any:
    if tools is not None and tools.auto:
        return grammars.for_grammar("lark", tools.lark(), param="tools")
    if tools is not None:
        return grammars.for_schema(tools.schema(), param="tools")
    return grammars.for_response_format(body["response_format"]) if _wants_json(body) else None


def _logprob_options(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    if endpoint == "chat":
        top = body.get("top_logprobs") or 0
        if not isinstance(top, int) or not 0 <= top <= 20:
            raise bad_request("'top_logprobs' must be an integer between 0 and 20.", param="top_logprobs")
        if top and not body.get("logprobs"):
            raise bad_request("'logprobs' must be true when 'top_logprobs' is set.", param="logprobs")
        return {"logprobs": bool(body.get("logprobs")), "top_logprobs": top}
    requested = body.get("logprobs")
    if requested is not None and (not isinstance(requested, int) or not 0 <= requested <= 5):
        raise bad_request("'logprobs' must be an integer between 0 and 5.", param="logprobs")
    return {"logprobs": requested is not None, "top_logprobs": requested or 0}


@dataclass
class Completion:
    """Accumulates one request's outputs and renders them the way its endpoint wants."""

    endpoint: str
    model: str
    token_text: TokenText
    include_usage: bool = False
    tools: ToolRequest | None = None  # the answer may be a constrained tool call (tools.py): `tool_calls`
    index: int = 0  # which of the request's n choices this is
    prompt: Prompt | None = None  # with completions' echo: its text (and ids) go before the answer
    id: str = ""  # "" for a fresh one: chatcmpl-... for chat, cmpl-... for completions (as vLLM and OpenAI)
    created: int = field(default_factory=lambda: int(time.time()))
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # echo with logprobs: the prompt tokens' own
    echo_sent: bool = False  # streams: the echo goes out with the first chunk
    last: RequestOutput | None = None
    # vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries the usage so far
    continuous_usage: bool = False

    def __post_init__(self) -> None:
        self.id = self.id or f"{'chatcmpl' if self.is_chat else 'cmpl'}-{uuid.uuid4().hex}"

    @property
    def is_chat(self) -> bool:
        return self.endpoint == "chat"

    @property
    def echo(self) -> str:
        return self.prompt.echo if self.prompt is not None else ""

    def add(self, output: RequestOutput) -> None:
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        self.text += output.new_text
        self.logprobs += output.new_logprobs
        self.last = output

    # --- whole responses -------------------------------------------------------------------------------

    def choice(self) -> dict[str, Any]:
        finish = self.last.finish_reason if self.last else "stop"
        choice: dict[str, Any] = {"index": self.index}
        if self.is_chat:
            message: dict[str, Any] = {"role": "assistant", "content": self.text}
            if self._may_be_call():  # a call, whole or cut short; never the engine's call JSON as text
                calls, finish = self._tool_calls(finish)
                message = (
                    {**message, "content": None, "tool_calls": calls} if calls else {**message, "content": ""}
                )
            choice["message"] = message
        else:
            choice["text"] = self.echo + self.text
        return {
            **choice,
            "logprobs": self._logprobs(self.logprobs, with_prompt=True),
            "finish_reason": finish,
            "stop_reason": self.last.stop_reason if self.last else None,
        }

    def usage(self) -> dict[str, Any]:
        out = self.last
        prompt, completion = (out.num_prompt_tokens, out.num_output_tokens) if out else (0, 0)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens if out else 0},
        }

    def _envelope(self) -> dict[str, Any]:
        kind = "chat.completion" if self.is_chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    # --- streaming -------------------------------------------------------------------------------------

    def first_chunk(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant role."""
        return self._chunk({"role": "assistant", "content": ""}, None, []) if self.is_chat else None

    def chunk(self, output: RequestOutput) -> dict[str, Any] | None:
        """The stream's next chunk; for a tool call, None until the call is complete, then the whole call."""
        self.add(output)
        if self._may_be_call():  # held back until whole
            return self._tool_call_chunk(output.finish_reason) if output.finish_reason else None
        if self.is_chat:
            return self._chunk({"content": output.new_text}, output.finish_reason, output.new_logprobs)
        echo, self.echo_sent = ("" if self.echo_sent else self.echo), True  # an echo leads the first chunk
        return self._chunk(echo + output.new_text, output.finish_reason, output.new_logprobs, bool(echo))

    def _tool_call_chunk(self, finish: str) -> dict[str, Any]:
        calls, finish = self._tool_calls(finish)
        if not calls:  # cut short before the call's name was whole: nothing to say
            return self._chunk({"content": ""}, finish, [])
        return self._chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}, finish, [])

    def _may_be_call(self) -> bool:
        """Under "auto" the answer is text unless its first character opens the call marker."""
        return self.tools is not None and (not self.tools.auto or not self.text or self.text[0] == "<")

    def _tool_calls(self, finish: str) -> tuple[list[dict[str, Any]], str]:
        """The call the answer makes and the finish_reason: "tool_calls" when the call is whole and ended as
        it should; cut short (max_tokens, a stop string), the call so far with the engine's finish_reason
        (OpenAI's truncated call), no call before its name is whole. Never the engine's call JSON as text."""
        assert self.tools is not None
        whole = self.tools.calls(self.text)
        if whole and finish == "stop":
            return whole, "tool_calls"
        return whole or self.tools.calls_so_far(self.text), finish

    def usage_chunk(self) -> dict[str, Any]:
        return {**self._envelope(), "object": self._chunk_object(), "choices": [], "usage": self.usage()}

    def _chunk(
        self, content: Any, finish: str | None, logprobs: list[TokenLogprob], with_prompt: bool = False
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": self.index,
            "finish_reason": finish,
            "stop_reason": self.last.stop_reason if finish and self.last else None,  # vLLM's: what stopped it
            "logprobs": self._logprobs(logprobs, with_prompt),
        }
        choice["delta" if self.is_chat else "text"] = content
        chunk = {**self._envelope(), "object": self._chunk_object(), "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = self._usage_so_far() if self.continuous_usage else None
        return chunk

    def _usage_so_far(self) -> dict[str, Any]:
        """This choice's usage at this chunk (vLLM's continuous usage, its three counts): before any output,
        the prompt alone."""
        if self.last is not None:
            prompt, completion = self.last.num_prompt_tokens, self.last.num_output_tokens
        else:
            prompt, completion = (len(self.prompt.ids) if self.prompt is not None else 0), 0
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.is_chat else "text_completion"

    # --- logprobs --------------------------------------------------------------------------------------

    def _logprobs(self, items: list[TokenLogprob], with_prompt: bool = False) -> dict[str, Any] | None:
        """`with_prompt`: an echo's prompt tokens first, with their logprobs (the first token has none)."""
        if self.is_chat:
            return self._chat_logprobs(items) if items else None
        prompt = self._prompt_entries() if with_prompt and self.prompt_logprobs is not None else []
        entries = prompt + [(i.token_id, i.logprob, i.top) for i in items]
        return self._completion_logprobs(entries, from_start=bool(prompt)) if entries else None

    def _prompt_entries(self) -> list[tuple[int, float | None, list[tuple[int, float]] | None]]:
        assert self.prompt is not None and self.prompt_logprobs is not None
        found = self.prompt_logprobs
        return [
            (token, found[i].logprob, found[i].top)
            if i < len(found) and found[i] is not None
            else (token, None, None)
            for i, token in enumerate(self.prompt.ids)
        ]

    def _chat_logprobs(self, items: list[TokenLogprob]) -> dict[str, Any]:
        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            text = self.token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        content = [
            {**entry(i.token_id, i.logprob), "top_logprobs": [entry(t, lp) for t, lp in i.top]} for i in items
        ]
        return {"content": content}

    def _completion_logprobs(
        self, entries: list[tuple[int, float | None, list[tuple[int, float]] | None]], from_start: bool
    ) -> dict[str, Any]:
        """OpenAI's legacy form; offsets count from the start of the returned text (echo included): from 0
        when the entries start with the prompt, else back from the end of the text so far."""
        tokens = [self.token_text(token) for token, _, _ in entries]
        offsets, position = [], 0 if from_start else len(self.echo) + len(self.text) - sum(map(len, tokens))
        for token in tokens:
            offsets.append(position)
            position += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [logprob for _, logprob, _ in entries],
            "top_logprobs": [
                None if top is None else {self.token_text(t): lp for t, lp in top} for _, _, top in entries
            ],
            "text_offset": offsets,
        }


@dataclass
class Choices:
    """A request's n choices: a Completion each, sharing id and creation time; one response, one usage."""

    completions: list[Completion]
    n: int = 1  # choices per prompt

    @classmethod
    def of(cls, n: int, endpoint: str, model: str, token_text: TokenText, include_usage: bool = False,
           tools: ToolRequest | None = None, prompts: list[Prompt] | None = None,
           continuous_usage: bool = False) -> "Choices":  # fmt: skip
        """n choices for each prompt (given for completions: their echo); index = prompt index * n + choice.
        `continuous_usage` (with include_usage): each chunk carries its choice's usage so far."""
        batch: list[Prompt | None] = list(prompts) if prompts else [None]
        usage = {"include_usage": include_usage, "continuous_usage": include_usage and continuous_usage}
        first = Completion(endpoint, model, token_text, tools=tools, prompt=batch[0], **usage)
        rest = [
            Completion(
                endpoint,
                model,
                token_text,
                tools=tools,
                index=i,
                prompt=batch[i // n],
                id=first.id,
                created=first.created,
                **usage,
            )  # fmt: skip
            for i in range(1, n * len(batch))
        ]
        return cls([first, *rest], n)

    def response(self) -> dict[str, Any]:
        first = self.completions[0]
        return {**first._envelope(), "choices": [c.choice() for c in self.completions], "usage": self.usage()}

    def usage(self) -> dict[str, Any]:
        """Each prompt counted once (as OpenAI bills n choices), the completion tokens of every choice."""
        firsts = [c.usage() for c in self.completions[:: self.n]]
        prompt = sum(u["prompt_tokens"] for u in firsts)
        cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in firsts)
        completion = sum(c.usage()["completion_tokens"] for c in self.completions)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip

    def usage_chunk(self) -> dict[str, Any]:
        return {**self.completions[0].usage_chunk(), "usage": self.usage()}
