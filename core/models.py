"""Model aliases, the deployments behind them, and their prices."""

import os
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BackendKind = Literal["openai", "local_engine", "local_embeddings"]
ExtraParams = Literal["passthrough", "reject"]
_NO_EXTRAS_HOSTS = ("api.openai.com",)  # hosted APIs that answer 400 to parameters they do not know
Endpoint = Literal["chat", "completions", "embeddings"]


class DeploymentConfig(BaseModel):
    """One place that serves a model: an upstream URL, or the embedded engine."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not a silent default

    name: str = Field(
        min_length=1,
        max_length=200,
        description="the deployment's own name (its pool, health, breaker, metrics)",
    )
    backend: BackendKind = Field(
        default="openai",
        description="openai: any OpenAI-compatible server at base_url; local_engine: the embedded engine; "
        "local_embeddings: an in-process embedding model",
    )
    base_url: str | None = None  # e.g. http://vllm-small:8000/v1
    model: str = Field(min_length=1)  # the model name the upstream expects
    api_key_env: str | None = None  # name of the env var holding the upstream key
    weight: float = Field(default=1.0, gt=0, description="its share against the alias's other deployments")
    input_price_per_1m: float = Field(default=0.0, ge=0)  # USD per 1M prompt tokens
    output_price_per_1m: float = Field(default=0.0, ge=0)  # USD per 1M completion tokens
    # USD per 1M prompt tokens the upstream served from its prefix cache (usage.prompt_tokens_details.
    # cached_tokens), as OpenAI and Anthropic discount them; None = the input price
    cached_input_price_per_1m: float | None = Field(default=None, ge=0)
    connect_timeout_s: float = Field(default=5.0, gt=0, description="to open a connection to the upstream")
    read_timeout_s: float = Field(default=600.0, gt=0, description="between bytes of the upstream's answer")
    max_connections: int = Field(
        default=1024, ge=1, description="requests in flight to this upstream at once"
    )
    endpoints: list[Endpoint] = Field(
        default_factory=lambda: ["chat", "completions"], description="the APIs this deployment serves"
    )
    # for backend=local_engine: the engine settings of this deployment (fields of the engine's EngineSettings,
    # checked when settings load); None = the gateway's engine settings
    engine: dict[str, Any] | None = None
    # request fields beyond OpenAI's (vLLM's structured_outputs, llama.cpp's cache_prompt, ...): sent on, or the
    # deployment is skipped for such requests; None = passthrough for self-hosted OpenAI-compatible servers
    extra_params: ExtraParams | None = None
    responses_api: bool = False  # the upstream serves POST /v1/responses itself (vLLM): sent there as is
    # requests it runs at once (vLLM's --max-num-seqs): admission holds the rest in the gateway's queues
    # (routing/admission); None = learned from the engine's scraped metrics
    max_concurrency: int | None = Field(default=None, ge=1)
    # send the tenant's service class as vLLM's `priority` (vLLM started with --scheduling-policy priority;
    # our engine always takes it); None = only to backend local_engine
    send_priority: bool | None = None

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname):
            raise ValueError(f"base_url must be an http:// or https:// URL with a host, not {url!r}")
        return url

    @field_validator("api_key_env")
    @classmethod
    def _not_ours(cls, name: str | None) -> str | None:
        """The gateway's own secrets (master key, admin token, database and Redis URLs) never go upstream."""
        if name is not None and name.upper().startswith("LLMGW_"):
            raise ValueError("api_key_env may not name one of the gateway's own LLMGW_* variables")
        return name

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

    def takes_priority(self) -> bool:
        return self.send_priority if self.send_priority is not None else self.backend == "local_engine"

    def accepts_extras(self) -> bool:
        if self.extra_params is not None:
            return self.extra_params == "passthrough"
        hosted = any(host in (self.base_url or "") for host in _NO_EXTRAS_HOSTS)
        return self.backend == "openai" and not hosted

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class ModelConfig(BaseModel):
    """A public model alias and the deployments behind it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="the public alias clients ask for")
    deployments: list[DeploymentConfig] = Field(min_length=1, description="where the alias is served")
    fallbacks: list[str] = Field(default_factory=list)  # other aliases to try when all deployments fail
    owned_by: str = Field(default="llmgw", description="the alias's `owned_by` in GET /v1/models")

    @model_validator(mode="after")
    def _consistent(self) -> "ModelConfig":
        if self.name in self.fallbacks:
            raise ValueError(f"model {self.name!r} cannot be its own fallback")
        if (clash := deployment_clash([self])) is not None:
            raise ValueError(clash)
        return self


def deployment_clash(models: list["ModelConfig"]) -> str | None:
    """Why these aliases cannot be served together, or None. A deployment name is one backend (its pool,
    health, breaker): aliases may share a deployment, but not give one name two configurations."""
    seen: dict[str, tuple[str, DeploymentConfig]] = {}
    for model in models:
        for deployment in model.deployments:
            first = seen.setdefault(deployment.name, (model.name, deployment))
            if first[1] != deployment:
                return (f"deployment name {deployment.name!r} is already used by model {first[0]!r} with "
                        "another configuration; give this deployment its own name")  # fmt: skip
    return None


def default_models() -> list[ModelConfig]:
    engine = DeploymentConfig(name="local-smollm2", backend="local_engine", model="smollm2")
    return [ModelConfig(name="smollm2", deployments=[engine])]


def cost_usd(
    deployment: DeploymentConfig, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> float:
    """USD for one attempt; `cached_tokens` (part of `prompt_tokens`) at the cached-input price, if one is set."""
    cached = min(max(cached_tokens, 0), prompt_tokens)
    cached_price = deployment.cached_input_price_per_1m
    if cached_price is None:
        cached_price, cached = deployment.input_price_per_1m, 0
    return (
        (prompt_tokens - cached) * deployment.input_price_per_1m
        + cached * cached_price
        + completion_tokens * deployment.output_price_per_1m
    ) / 1_000_000
