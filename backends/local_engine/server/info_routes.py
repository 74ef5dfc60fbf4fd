"""The engine server's routes besides generation, as vLLM's server names and shapes them: /health and /ping,
/metrics, /version, /v1/models, POST /tokenize and POST /detokenize."""

import importlib.metadata
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from backends.local_engine.server.served import LoadedEngine
from backends.local_engine.server.tokenize_api import detokenize, tokenize
from core.validation import parse_json

Ready = Callable[[], LoadedEngine]  # the loaded engine, or a 503 OpenAIError while loading or after a failure


def add_info_routes(app: FastAPI, ready: Ready, started: int) -> None:
    """`started`: the server's start (Unix seconds), the model card's `created`."""

    async def health() -> Response:
        ready()
        return Response(status_code=200)

    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/ping", health, methods=["GET", "POST"])  # vLLM's (SageMaker's) name for /health

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ready().metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/version")
    async def version() -> Response:
        return _json({"version": _VERSION})

    @app.get("/v1/models")
    async def models() -> Response:
        return _json({"object": "list", "data": [model_card(ready(), started)]})

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> Response:
        loaded = ready()
        limit = loaded.engine.engine.settings.max_model_len
        return _json(tokenize(loaded.model, loaded.model.name, parse_json(await request.body()), limit))

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> Response:
        loaded = ready()
        return _json(detokenize(loaded.model, loaded.model.name, parse_json(await request.body())))


def model_card(loaded: "LoadedEngine", started: int) -> dict[str, Any]:
    """vLLM's ModelCard: `root` is the model as the server was given it, `parent` (a LoRA's base) is null."""
    model = loaded.model
    return {
        "id": model.name,
        "object": "model",
        "created": started,
        "owned_by": "llmgw",
        "root": model.root or model.name,
        "parent": None,
        "max_model_len": loaded.engine.engine.settings.max_model_len,
    }


def _package_version() -> str:
    try:
        return importlib.metadata.version("llmgw")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


_VERSION = _package_version()


def _json(content: dict[str, Any]) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")
