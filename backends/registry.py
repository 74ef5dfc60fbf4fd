"""Builds one backend object per configured deployment, and keeps them in step with the model list."""

import logging

from backends.base import Backend
from backends.local import LocalEngineBackend
from backends.local_embeddings import LocalEmbeddingsBackend
from backends.local_engine.config import EngineSettings
from backends.openai_compat import OpenAICompatBackend
from core.models import DeploymentConfig, ModelConfig

log = logging.getLogger("llmgw.backends")


def build_backend(
    config: DeploymentConfig, engine: EngineSettings, engine_startup_timeout_s: float
) -> Backend:
    if config.backend == "local_engine":
        return LocalEngineBackend(config, engine, engine_startup_timeout_s)
    if config.backend == "local_embeddings":
        return LocalEmbeddingsBackend(config)
    return OpenAICompatBackend(config)


class Backends:
    """One started backend per deployment name; `apply` starts new ones and closes removed or changed ones."""

    def __init__(self, engine: EngineSettings, engine_startup_timeout_s: float = 300.0) -> None:
        """`engine`: the settings of deployments that name no engine settings of their own."""
        self._engine = engine
        self._startup_timeout_s = engine_startup_timeout_s
        self._by_name: dict[str, Backend] = {}

    async def apply(self, models: list[ModelConfig]) -> dict[str, list[Backend]]:
        """Model alias → its deployments' backends, for this model list."""
        wanted = {d.name: d for m in models for d in m.deployments}
        for name, backend in list(self._by_name.items()):
            if wanted.get(name) != backend.config:
                await self._by_name.pop(name).aclose()
        for name, config in wanted.items():
            if name not in self._by_name:
                self._by_name[name] = await self._start(config)
        return {m.name: [self._by_name[d.name] for d in m.deployments] for m in models}

    async def _start(self, config: DeploymentConfig) -> Backend:
        backend = build_backend(config, self._engine, self._startup_timeout_s)
        await backend.start()
        log.info("deployment %s (%s) is in the pool", config.name, config.backend)
        return backend

    def all(self) -> list[Backend]:
        return list(self._by_name.values())

    async def aclose(self) -> None:
        for backend in self._by_name.values():
            await backend.aclose()
        self._by_name.clear()
