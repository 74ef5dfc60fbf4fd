"""The one typed settings object: LLMGW_* environment variables plus an optional YAML file.

Nested sections use a double underscore: LLMGW_ENGINE__DTYPE=int4. The YAML file (LLMGW_CONFIG_FILE)
declares models (public aliases) and their deployments; environment variables win over the file.
"""

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from backends.local_engine.config import EngineSettings
from cache.config import CacheSettings
from core.models import ModelConfig, default_models, deployment_clash
from gateway.observability_config import ObservabilitySettings
from gateway.responses_api.config import ResponsesSettings
from gateway.tracing_config import TracingSettings
from gateway.ui.config import UiSettings
from policies.config import Connections, PoliciesSettings
from routing.config import RoutingSettings

DEFAULT_MASTER_KEY = "sk-llmgw-local"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMGW_", env_nested_delimiter="__", extra="ignore")

    host: str = Field(default="127.0.0.1", description="address the gateway listens on")
    port: int = Field(default=8000, ge=1, le=65535, description="port the gateway listens on")
    workers: int = Field(
        default=1,
        ge=1,
        description="gateway processes (uvicorn workers) sharing the port and one metrics directory",
    )
    log_level: str = Field(
        default="info", description="uvicorn's log level: critical, error, warning, info, debug"
    )
    config_file: Path | None = Field(
        default=None,
        description="the YAML file of settings (models and their deployments); variables win over it",
    )
    master_key: SecretStr = Field(
        default=SecretStr(DEFAULT_MASTER_KEY),
        description="a proxy key under no tenant's policy; the default serves a loopback-only gateway alone",
    )
    admin_token: SecretStr | None = Field(
        default=None, description="the admin API's and the console's token, with every right; None = both off"
    )
    database_url: str = Field(
        default="sqlite+aiosqlite:///./llmgw.db",
        description="tenants, keys, policies and usage; postgres:// and postgresql:// mean PostgreSQL (asyncpg)",
    )
    redis_url: str | None = Field(
        default=None,
        description="shared rate limits, cache and Responses store for a fleet; None or blank = in-process",
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        description="larger request bodies (as sent, or once decompressed) are refused (413)",
    )
    shutdown_grace_s: float = Field(default=30.0, ge=0)  # SIGTERM: in-flight work gets this long, then is cut
    keep_alive_s: float = Field(
        default=75.0,
        gt=0,
        description="an idle client connection stays open this long; longer than clients' and load balancers' "
        "idle timeouts, so none reuses a connection the gateway is closing (with uvicorn's 5 s, a client that keeps "
        "connections longer can send on one as it closes: 'server disconnected')",
    )
    models: list[ModelConfig] = Field(
        default_factory=default_models,
        description="public aliases and the deployments behind them (the YAML file's `models`); default: one "
        "alias, smollm2, served by the embedded engine",
    )
    engine: EngineSettings = Field(default_factory=EngineSettings)
    engine_startup_timeout_s: float = Field(
        default=300.0, description="an embedded engine not ready this long after start has failed to load"
    )
    cache: CacheSettings = Field(default_factory=CacheSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    policies: PoliciesSettings = Field(default_factory=PoliciesSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    ui: UiSettings = Field(default_factory=UiSettings)  # the operator console at /ui

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _YamlSource(settings_cls, init_settings, env_settings)

    @field_validator("redis_url", mode="before")
    @classmethod
    def _blank_is_unset(cls, url: Any) -> Any:
        return None if isinstance(url, str) and not url.strip() else url

    @field_validator("database_url")
    @classmethod
    def _async_driver(cls, url: str) -> str:
        """`postgres://` and `postgresql://` (the usual forms) mean PostgreSQL through asyncpg."""
        for bare in ("postgres://", "postgresql://"):
            if url.startswith(bare):
                return "postgresql+asyncpg://" + url.removeprefix(bare)
        return url

    @model_validator(mode="after")
    def _check_engine_sections(self) -> "Settings":
        """A deployment's own engine settings are the engine's fields: checked here, at load time."""
        for deployment in (d for m in self.models for d in m.deployments if d.engine is not None):
            EngineSettings.model_validate(deployment.engine)
        if (clash := deployment_clash(self.models)) is not None:
            raise ValueError(clash)
        return self

    def connections(self) -> Connections:
        """The policies package's databases and keys."""
        return Connections(self.database_url, self.redis_url, self.master_key, self.admin_token)

    def model(self, alias: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == alias), None)


class _YamlSource(PydanticBaseSettingsSource):
    """Reads the YAML file the config_file setting names: passed in, else LLMGW_CONFIG_FILE (read by `named_by`,
    the sources before this one)."""

    def __init__(self, settings_cls: type[BaseSettings], *named_by: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self._named_by = named_by

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = next((named for source in self._named_by if (named := source().get("config_file"))), None)
        if not path:
            return {}
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as error:
            raise ConfigFileError(f"the config file cannot be read: {error}") from error
        except yaml.YAMLError as error:
            raise ConfigFileError(f"{path} is not valid YAML: {str(error).splitlines()[0]}") from error
        if not isinstance(data, dict):
            raise ConfigFileError(f"{path}: the config file must be a mapping")
        unknown = sorted(set(data) - set(Settings.model_fields))
        if unknown:  # the file is ours alone (unlike the environment): a misspelt key is an error
            known = ", ".join(Settings.model_fields)
            raise ConfigFileError(f"{path}: unknown setting {unknown[0]!r} (known: {known})")
        return data


class ConfigFileError(ValueError):
    """The file named by LLMGW_CONFIG_FILE cannot be used; the message says why, for the command line."""


def load_settings(**overrides: Any) -> Settings:
    """Read the settings once, at start-up."""
    return Settings(**overrides)


_CREDENTIALS = re.compile(r"(://[^:/@\s]+):[^@\s]+@")  # a password in a URL


def database_problem(error: BaseException) -> str | None:
    """A short account of why the database could not be used (its password hidden), or None when `error` is
    not a database or connection error."""
    from sqlalchemy.exc import SQLAlchemyError

    if not isinstance(error, SQLAlchemyError | OSError):
        return None
    text = str(error).strip()
    first = _CREDENTIALS.sub(r"\1***@", text.splitlines()[0] if text else "")
    return (f"the database cannot be used ({type(error).__name__}: {first[:300]}); check LLMGW_DATABASE_URL, "
            "and run `llmgw migrate` on a new database")  # fmt: skip


def settings_problem(error: Exception) -> str | None:
    """A short account of why the settings could not be read (for the command line), or None when `error`
    is not about the settings. Values are not repeated: they may be secrets."""
    if isinstance(error, ValidationError):
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in error.errors()]
        return "invalid settings (LLMGW_* variables or the LLMGW_CONFIG_FILE file):\n" + "\n".join(lines)
    return str(error) if isinstance(error, ConfigFileError) else None
