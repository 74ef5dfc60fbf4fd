"""The one typed settings object: LLMGW_* environment variables plus an optional YAML file.

Nested sections use a double underscore: LLMGW_ENGINE__DTYPE=int4. The YAML file (LLMGW_CONFIG_FILE)
declares models (public aliases) and their deployments; environment variables win over the file.
"""

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from backends.local_engine.config import EngineSettings
from cache.config import CacheSettings
from gateway.observability_config import ObservabilitySettings
from gateway.responses_api.config import ResponsesSettings
from gateway.tracing_config import TracingSettings
from policies.config import PoliciesSettings
from routing.config import RoutingSettings

BackendKind = Literal["openai", "local_engine"]
ExtraParams = Literal["passthrough", "reject"]
_NO_EXTRAS_HOSTS = ("api.openai.com",)  # hosted APIs that answer 400 to parameters they do not know
Endpoint = Literal["chat", "completions", "embeddings"]
DEFAULT_MASTER_KEY = "sk-llmgw-local"


class DeploymentConfig(BaseModel):
    """One place that serves a model: an upstream URL, or the embedded engine."""

    name: str
    backend: BackendKind = "openai"
    base_url: str | None = None  # e.g. http://vllm-small:8000/v1
    model: str  # the model name the upstream expects
    api_key_env: str | None = None  # name of the env var holding the upstream key
    weight: float = 1.0
    input_price_per_1m: float = 0.0  # USD per 1M prompt tokens
    output_price_per_1m: float = 0.0  # USD per 1M completion tokens
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    max_connections: int = 1024
    endpoints: list[Endpoint] = Field(default_factory=lambda: ["chat", "completions"])
    engine: EngineSettings | None = None  # for backend=local_engine; None = the gateway's engine settings
    # request fields beyond OpenAI's (vLLM's structured_outputs, llama.cpp's cache_prompt, ...): sent on, or the
    # deployment is skipped for such requests; None = passthrough for self-hosted OpenAI-compatible servers
    extra_params: ExtraParams | None = None
    responses_api: bool = False  # the upstream serves POST /v1/responses itself (vLLM): sent there as is

    @model_validator(mode="after")
    def _needs_url(self) -> "DeploymentConfig":
        if self.backend == "openai" and not self.base_url:
            raise ValueError(f"deployment {self.name!r}: backend 'openai' needs base_url")
        if self.responses_api and self.backend != "openai":
            raise ValueError(f"deployment {self.name!r}: responses_api needs an OpenAI-compatible upstream")
        return self

    def accepts_extras(self) -> bool:
        if self.extra_params is not None:
            return self.extra_params == "passthrough"
        hosted = any(host in (self.base_url or "") for host in _NO_EXTRAS_HOSTS)
        return self.backend == "openai" and not hosted

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class ModelConfig(BaseModel):
    """A public model alias and the deployments behind it."""

    name: str
    deployments: list[DeploymentConfig]
    fallbacks: list[str] = Field(default_factory=list)  # other aliases to try when all deployments fail
    owned_by: str = "llmgw"


def default_models() -> list[ModelConfig]:
    engine = DeploymentConfig(name="local-smollm2", backend="local_engine", model="smollm2")
    return [ModelConfig(name="smollm2", deployments=[engine])]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMGW_", env_nested_delimiter="__", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    log_level: str = "info"
    config_file: Path | None = None
    master_key: SecretStr = SecretStr(DEFAULT_MASTER_KEY)
    admin_token: SecretStr | None = None
    database_url: str = "sqlite+aiosqlite:///./llmgw.db"
    redis_url: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    shutdown_grace_s: float = Field(default=30.0, ge=0)  # SIGTERM: in-flight work gets this long, then is cut
    models: list[ModelConfig] = Field(default_factory=default_models)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    engine_startup_timeout_s: float = 300.0
    cache: CacheSettings = Field(default_factory=CacheSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    policies: PoliciesSettings = Field(default_factory=PoliciesSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _YamlSource(settings_cls)

    def model(self, alias: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == alias), None)


class _YamlSource(PydanticBaseSettingsSource):
    """Reads the YAML file named by LLMGW_CONFIG_FILE (or config_file passed in)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("LLMGW_CONFIG_FILE")
        if not path:
            return {}
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the config file must be a mapping")
        return data


def load_settings(**overrides: Any) -> Settings:
    """Read the settings once, at start-up."""
    return Settings(**overrides)
