"""Settings of metrics and the access log, nested in the gateway settings (LLMGW_OBSERVABILITY__<FIELD>)."""

from pydantic import BaseModel, ConfigDict, Field


class ObservabilitySettings(BaseModel):
    """What the gateway exports about each request. Label cardinality stays bounded by design."""

    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a silent default

    metrics_enabled: bool = True  # False: no Prometheus recording (the /metrics route still answers)
    tenant_label: bool = False  # label token, cost and request metrics with the tenant id
    max_tenant_labels: int = Field(default=200, ge=1)  # distinct tenants per process; later ones → "other"
    access_log: bool = True  # one JSON line per request on the `llmgw.access` logger
    access_log_bodies: bool = False  # also log prompt and response text (may hold personal data)
    access_log_body_chars: int = Field(default=2000, ge=0)  # cut logged text after this many characters
    # extra (non-OpenAI) request parameters whose values the access log must not show, e.g. ["mm_processor_kwargs"]
    sensitive_params: list[str] = Field(default_factory=list)
