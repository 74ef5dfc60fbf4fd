"""The engine's OpenAI-compatible HTTP server: completions and chat completions here; models, health, metrics,
version and vLLM's /tokenize and /detokenize in info_routes.py.

The model loads on a background thread after the socket is open, so the server answers at once and
/health turns 200 only when the model is ready. Streams and waiting requests are aborted when the client
goes away.
"""

import asyncio
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from backends.local_engine.engine.async_engine import AsyncEngine, RequestFailed
from backends.local_engine.engine.outputs import RequestOutput
from backends.local_engine.engine.request_checks import (
    InvalidParam,
    check_params,
    check_room,
    check_token_ids,
    without_nulls,
)
from backends.local_engine.engine.sampling_params import SamplingParams
from backends.local_engine.server.info_routes import add_info_routes
from backends.local_engine.server.prompts import Prompt, prompts
from backends.local_engine.server.protocol import Choices, choice_params
from backends.local_engine.server.served import LoadedEngine
from backends.local_engine.server.tools import engine_chat
from core.errors import OpenAIError, bad_request, model_not_found
from core.sse import DONE, event
from core.validation import parse_json, validate

log = logging.getLogger("llmgw.engine")


class EngineState:
    """The loaded engine once ready; requests before that get 503."""

    def __init__(self, load: Callable[[], LoadedEngine], on_failed: Callable[[], None] | None = None) -> None:
        self._load = load
        self._on_failed = on_failed
        self.loaded: LoadedEngine | None = None
        self.failed: BaseException | None = None

    def load_in_background(self) -> threading.Thread:
        thread = threading.Thread(target=self._load_now, name="engine-load", daemon=True)
        thread.start()
        return thread

    def _load_now(self) -> None:
        try:
            self.loaded = self._load()
            # Everything loaded so far (torch, the model, the tokenizer: millions of objects) lives as long as
            # the server: frozen, the cyclic collector stops re-scanning it during steps (it took 3-6 % of a
            # loaded CPU engine's time in studies.engine_step_profile).
            gc.collect()
            gc.freeze()
            self.loaded.engine.start()
            log.info("engine ready: serving %s", self.loaded.model.name)
        except BaseException as error:
            log.exception("the engine failed to load")
            self.failed = error
            if self._on_failed is not None:
                self._on_failed()

    def ready(self) -> LoadedEngine:
        if self.failed is not None:  # the log has the traceback; the client gets the kind of failure only
            message = f"The engine failed to load ({type(self.failed).__name__}); see the server log."
            raise OpenAIError(503, message, code="engine_load_failed")
        if self.loaded is None or not self.loaded.engine.alive:
            raise OpenAIError(503, "The engine is not ready.", code="engine_not_ready")
        return self.loaded

    def stop(self) -> None:
        if self.loaded is not None:
            self.loaded.engine.stop()


def create_app(
    load: Callable[[], LoadedEngine],
    on_load_failed: Callable[[], None] | None = None,
) -> FastAPI:
    """`on_load_failed`: called (on the loading thread) after a failed load is logged; serve.py exits."""
    state = EngineState(load, on_load_failed)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.load_in_background()
        yield
        state.stop()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine_state = state
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    add_info_routes(app, state.ready, started=int(time.time()))
    _add_routes(app, state)
    return app


def _add_routes(app: FastAPI, state: EngineState) -> None:
    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _serve(request, state.ready(), "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, state.ready(), "completions")


async def _serve(request: Request, loaded: LoadedEngine, endpoint: str) -> Response:
    body = without_nulls(parse_json(await request.body()))  # null: the default, as OpenAI and vLLM read it
    validate(endpoint, body)
    if body["model"] != loaded.model.name:
        raise model_not_found(body["model"])
    settings = loaded.engine.engine.settings
    when_unset = settings.max_tokens_when_unset or settings.max_model_len  # None: the context decides
    params = choice_params(endpoint, body, when_unset, loaded.model.grammars)
    tools = None
    if endpoint == "chat":
        body, tools = engine_chat(body)
    batch = prompts(loaded.model, endpoint, body)
    param = "messages" if endpoint == "chat" else "prompt"
    _check(params[0], batch, loaded.model.vocab_size, param, body, settings.max_model_len)
    stream_options = body.get("stream_options") or {}
    usage = bool(stream_options.get("include_usage")), bool(stream_options.get("continuous_usage_stats"))
    name, token_text = loaded.model.name, loaded.model.token_text
    choices = Choices.of(len(params), endpoint, name, token_text, usage[0], tools, batch, usage[1])
    starts = await _start_all(loaded.engine, [p.ids for p in batch], params, param)
    for _ in batch:  # vLLM's request_params_n: one observation per prompt, however many choices it has
        loaded.metrics.on_request(len(params))
    if body.get("stream"):
        return StreamingResponse(_sse(choices, starts), media_type="text/event-stream")
    return await _until_done_or_disconnect(request, choices, starts)


Started = list[tuple[RequestOutput, AsyncIterator[RequestOutput]]]  # per choice: first output, the rest


def _check(
    params: SamplingParams,
    batch: list[Prompt],
    vocab_size: int | None,
    param: str,
    body: dict[str, Any],
    max_model_len: int,
) -> None:
    """vLLM's ranges for the sampling parameters, prompt token ids in the vocabulary, a max_tokens set that
    fits in the context with each prompt: else a 400."""
    try:
        check_params(params, vocab_size)
        for prompt in batch:
            check_token_ids(prompt.ids, vocab_size, param)
            check_room(len(prompt.ids), body, max_model_len, param)
    except InvalidParam as error:
        raise bad_request(str(error), param=error.param, code=error.code) from error


async def _start_all(
    engine: AsyncEngine, batch: list[list[int]], params: list[SamplingParams], param: str
) -> Started:
    """Every prompt's choices, in order (choice index = prompt index * n + choice)."""
    if len(batch) == 1:
        return await _start(engine, batch[0], params, param)
    return await _all_or_none([_start(engine, ids, params, param) for ids in batch])


async def _start(
    engine: AsyncEngine, prompt_ids: list[int], params: list[SamplingParams], param: str
) -> Started:
    """One prompt's choices. The first runs its prefill alone, so the others find the prompt in the prefix
    cache; a refusal (context too long) is a 400 before any other choice starts."""
    first = await _start_one(engine, prompt_ids, params[0], param)
    return await _all_or_none([_start_one(engine, prompt_ids, p, param) for p in params[1:]], first)


async def _start_one(
    engine: AsyncEngine, prompt_ids: list[int], params: SamplingParams, param: str
) -> Started:
    outputs = engine.generate(prompt_ids, params)
    return [(await _first_output(outputs, param), outputs)]


async def _all_or_none(starting: list[Awaitable[Started]], started: Started | None = None) -> Started:
    """`started` and everything `starting` starts; if any fails, every request started is aborted and the first
    failure (a 400) raised."""
    results = await asyncio.gather(*starting, return_exceptions=True)
    started = [*(started or []), *(s for r in results if not isinstance(r, BaseException) for s in r)]
    if failed := [r for r in results if isinstance(r, BaseException)]:
        await _close(started)
        raise failed[0]
    return started


async def _close(starts: Started) -> None:
    for _, outputs in starts:
        await outputs.aclose()  # aborts the request in the engine if it is still running


async def _interleave(starts: Started) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(choice index, output) as the engine produces them, across the choices."""
    if len(starts) == 1:  # the common case, without a task and a queue per token
        first, outputs = starts[0]
        yield 0, first
        async for output in outputs:
            yield 0, output
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, first: RequestOutput, outputs: AsyncIterator[RequestOutput]) -> None:
        try:
            await queue.put((index, first))
            async for output in outputs:
                await queue.put((index, output))
            await queue.put((index, None))
        except Exception as error:  # the engine loop died: the reader raises it
            await queue.put((index, error))

    tasks = [asyncio.ensure_future(pump(i, first, outputs)) for i, (first, outputs) in enumerate(starts)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                running -= 1
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _close(starts)


async def _first_output(outputs: AsyncIterator[RequestOutput], param: str) -> RequestOutput:
    """The first step's output, so refusals (context too long) become a 400 before headers go out."""
    try:
        return await anext(outputs)
    except ValueError as error:
        code = "context_length_exceeded" if "context length" in str(error) else None
        raise bad_request(str(error), param=getattr(error, "param", param), code=code) from error
    except RequestFailed as error:
        raise _failed(error) from error
    except RuntimeError as error:
        raise _unavailable(error) from error


async def _sse(choices: Choices, starts: Started) -> AsyncIterator[bytes]:
    """The chunks; a request the engine failed on (or a dead loop) ends with an error event, without [DONE]."""
    merged = _interleave(starts)
    try:
        for completion in choices.completions:
            if (opening := completion.first_chunk()) is not None:
                yield event(opening)
        async for index, output in merged:
            if (chunk := choices.completions[index].chunk(output)) is not None:
                yield event(chunk)
        if choices.completions[0].include_usage:
            yield event(choices.usage_chunk())
        yield DONE
    except (RequestFailed, RuntimeError) as error:
        failure = _failed(error) if isinstance(error, RequestFailed) else _unavailable(error)
        yield event(failure.to_dict())
    finally:  # the client left early: abort every choice's request
        await merged.aclose()
        await _close(starts)


async def _until_done_or_disconnect(request: Request, choices: Choices, starts: Started) -> Response:
    async def collect() -> None:
        async for index, output in _interleave(starts):
            choices.completions[index].add(output)

    task = asyncio.ensure_future(collect())
    while not task.done():
        await asyncio.wait({task}, timeout=0.5)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
            await _close(starts)
            return Response(status_code=499)
    try:
        task.result()
    except RequestFailed as error:  # the engine failed on this request (the loop serves on)
        raise _failed(error) from error
    except RuntimeError as error:  # the engine loop died mid-request
        raise _unavailable(error) from error
    return _json(choices.response())


def _failed(error: RequestFailed) -> OpenAIError:
    return OpenAIError(500, str(error), code="engine_request_failed")


def _unavailable(error: RuntimeError) -> OpenAIError:
    return OpenAIError(503, str(error), code="engine_unavailable")


def _json(content: dict[str, Any], status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


async def _openai_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, OpenAIError)
    return Response(error.to_json(), status_code=error.status, media_type="application/json")


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, StarletteHTTPException)
    return await _openai_error(request, OpenAIError(error.status_code, str(error.detail)))
