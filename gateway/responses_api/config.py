"""Settings of the Responses API store, nested in the gateway settings (LLMGW_RESPONSES__<FIELD>)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ResponsesSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a silent default

    store: Literal["auto", "memory", "redis"] = Field(
        default="auto", description="auto: Redis when redis_url is set (shared by a fleet), else in-process"
    )
    ttl_s: int = Field(
        default=7 * 24 * 3600, ge=1, description="how long a stored response stays retrievable"
    )
    max_entries: int = Field(default=10_000, ge=1, description="in-process store only; the oldest go first")
    key_prefix: str = Field(
        default="llmgw:responses", description="every Redis key of the store starts with it"
    )
