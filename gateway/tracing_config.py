"""OpenTelemetry settings, nested in the gateway settings (LLMGW_TRACING__<FIELD>). Off by default."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TracingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a silent default

    enabled: bool = False  # one trace per request, a span per stage and per backend attempt
    exporter: Literal["otlp", "none"] = "otlp"  # none: spans are made but only custom processors see them
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP traces URL; None = OTEL_EXPORTER_OTLP_* variables or localhost:4318",
    )
    service_name: str = "llmgw"  # the service.name resource attribute of every span
