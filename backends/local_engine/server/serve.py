"""`engine serve`: settings from LLMGW_ENGINE__* variables and --options, the model wiring, and uvicorn.

Every EngineSettings field is also an option (--max-num-seqs 16, --speculative-ngram true); options win
over the environment. The socket opens at once; /health answers 200 once the model is loaded.
"""

import argparse
import logging
import os
import sys
import threading
import typing
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from backends.local_engine.config import EngineSettings
from backends.local_engine.engine.threads import configure_openmp
from backends.local_engine.server.served import LoadedEngine, ServedModel
from backends.local_engine.server.server import create_app
from core.renamed import accepted_names

log = logging.getLogger("llmgw.engine")
ENV_PREFIX = "LLMGW_ENGINE__"
FAILED_LOAD_GRACE_S = 3.0  # after a failed load: /health says so this long (6 polls of local.py), then exit 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port, default=8001)
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    for name, info in EngineSettings.model_fields.items():
        kind: dict[str, Any] = {}
        if (
            typing.get_origin(info.annotation) is typing.Literal
        ):  # a misspelt choice: one line, not a traceback
            kind["choices"] = typing.get_args(info.annotation)
        elif info.annotation in (int, float):
            kind["type"] = info.annotation
        parser.add_argument(
            f"--{name.replace('_', '-')}", dest=name, default=None, help=f"default {info.default}", **kind
        )


def port(text: str) -> int:
    """A TCP port, 1-65535 (an int past 65535 would bind another port, modulo 65536)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is outside 1-65535")
    return value


def settings_from(args: argparse.Namespace, environ: dict[str, str]) -> EngineSettings:
    values: dict[str, Any] = {
        key[len(ENV_PREFIX) :].lower(): value for key, value in environ.items() if key.startswith(ENV_PREFIX)
    }
    values.update(
        {name: getattr(args, name) for name in EngineSettings.model_fields if getattr(args, name) is not None}
    )
    known = accepted_names(EngineSettings)  # the fields and their deprecated names
    return EngineSettings.model_validate({k: v for k, v in values.items() if k in known})


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = settings_from(args, dict(os.environ))
    except ValidationError as error:  # an LLMGW_ENGINE__* value or a --option pydantic refuses: one line each
        for problem in error.errors():
            field = ".".join(map(str, problem["loc"]))
            print(f"llmgw engine serve: {field}: {problem['msg']}", file=sys.stderr)
        return 2
    # OpenMP waits (threads.py): torch is not imported yet, so this still takes effect
    configure_openmp(settings.adaptive_threads)
    return serve(lambda: load_local_engine(settings), args.host, args.port, args.log_level)


def serve(
    load: Callable[[], LoadedEngine],
    host: str,
    port: int,
    log_level: str = "info",
    failed_load_grace_s: float = FAILED_LOAD_GRACE_S,
) -> int:
    """Serve until stopped (0) or until the model fails to load (1), as vLLM's server exits when its engine
    cannot start. The failure's traceback is logged once; for `failed_load_grace_s` /health still answers
    503 engine_load_failed with the kind of failure, so a supervisor polling it (the gateway's
    backends/local.py) can say which kind before it sees the process exit."""
    import uvicorn

    server: uvicorn.Server | None = None

    def exit_soon() -> None:
        timer = threading.Timer(failed_load_grace_s, lambda: setattr(server, "should_exit", True))
        timer.daemon = True
        timer.start()

    app = create_app(load, on_load_failed=exit_soon)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5, access_log=False
    )
    server = uvicorn.Server(config)
    log.info("engine server listening on http://%s:%s (model loading)", host, port)
    server.run()
    if app.state.engine_state.failed is not None:
        log.error("exiting with status 1: the engine failed to load (the cause is logged above)")
        return 1
    return 0 if server.started else 1  # not started: the socket could not be bound (uvicorn logged why)


def load_local_engine(settings: EngineSettings) -> LoadedEngine:
    """Load the model, size the KV pool from the memory setting, and wire engine, metrics and tokenizer."""
    from backends.local_engine.engine.async_engine import AsyncEngine
    from backends.local_engine.engine.detokenizer import IncrementalDetokenizer
    from backends.local_engine.engine.llm_engine import LLMEngine
    from backends.local_engine.engine.model_runner import ModelRunner
    from backends.local_engine.engine.sampler import probabilities
    from backends.local_engine.engine.structured import grammars_for
    from backends.local_engine.loading.gguf import packaged_model_path
    from backends.local_engine.server.metrics import EngineMetrics

    runner = ModelRunner(settings)
    log_capacity(
        settings, runner.weight_bytes, runner.kv_bytes_per_token, runner.num_blocks, runner.block_size
    )
    tokenizer = runner.tokenizer

    def detokenizer(prompt_ids: list[int], params: Any) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(tokenizer, prompt_ids, params)

    sample_fn = sample_async_fn = None
    if runner.device.type == "cuda":
        from backends.local_engine.engine.device_sampler import DeviceSampler

        sampler = DeviceSampler()  # batched on the GPU: one host sync per step, or none (async decode)
        sample_fn, sample_async_fn = sampler.sample, sampler.sample_async
    engine = LLMEngine(
        settings, runner, probabilities, detokenizer, sample_fn, sample_async_fn, runner.config.vocab_size
    )
    metrics = EngineMetrics(engine, settings.served_model_name)
    model = ServedModel(
        settings.served_model_name,
        tokenizer.encode,
        tokenizer.encode_chat,
        tokenizer.token_text,
        grammars_for(tokenizer),
        runner.config.vocab_size,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        root=str(settings.model) if settings.model is not None else packaged_model_path().name,
    )
    return LoadedEngine(AsyncEngine(engine, metrics), model, metrics)


def log_capacity(
    settings: EngineSettings, weight_bytes: int, kv_bytes_per_token: int, num_blocks: int, block_size: int
) -> None:
    tokens = num_blocks * block_size
    log.info(
        "capacity: weights %.1f MiB; KV %d bytes/token; %d MiB KV pool = %d blocks x %d tokens = %d tokens;"
        " %.1f sequences of max_model_len=%d fit",
        weight_bytes / 2**20,
        kv_bytes_per_token,
        settings.kv_cache_memory_mb,
        num_blocks,
        block_size,
        tokens,
        tokens / settings.max_model_len,
        settings.max_model_len,
    )
