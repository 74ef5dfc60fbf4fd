"""Model aliases, the deployments behind them, and their prices."""

import os
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

BackendKind = Literal["openai", "local_engine", "local_embeddings"]
ExtraParams = Literal["passthrough", "reject"]
_NO_EXTRAS_HOSTS = ("api.openai.com",)  # hosted APIs that answer 400 to parameters they do not know
Endpoint = Literal["chat", "completions", "embeddings"]


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
    # for backend=local_engine: the engine settings of this deployment (fields of the engine's EngineSettings,
    # checked when settings load); None = the gateway's engine settings
    engine: dict[str, Any] | None = None
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
        if self.backend == "local_embeddings":  # an embedding model: it serves /v1/embeddings only
            if "endpoints" not in self.model_fields_set:
                self.endpoints = ["embeddings"]
            if self.endpoints != ["embeddings"]:
                raise ValueError(
                    f"deployment {self.name!r}: local_embeddings serves endpoints ['embeddings'] only"
                )
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


def cost_usd(deployment: DeploymentConfig, prompt_tokens: int, completion_tokens: int) -> float:
    return (
        prompt_tokens * deployment.input_price_per_1m + completion_tokens * deployment.output_price_per_1m
    ) / 1_000_000
