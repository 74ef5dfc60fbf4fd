"""Builds one backend object per configured deployment."""

from backends.base import Backend
from backends.local import LocalEngineBackend
from backends.openai_compat import OpenAICompatBackend
from gateway.settings import DeploymentConfig, Settings


def build_backend(config: DeploymentConfig, settings: Settings) -> Backend:
    if config.backend == "local_engine":
        return LocalEngineBackend(config, settings.engine, settings.engine_startup_timeout_s)
    return OpenAICompatBackend(config)


def build_pools(settings: Settings) -> dict[str, list[Backend]]:
    """Model alias → its deployments' backends."""
    return {model.name: [build_backend(d, settings) for d in model.deployments] for model in settings.models}
