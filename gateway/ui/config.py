"""Settings of the operator console (LLMGW_UI__<FIELD>); it is served only when an admin token is set."""

from pydantic import BaseModel, ConfigDict, Field


class UiSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="serve /ui when LLMGW_ADMIN_TOKEN is set")
    session_ttl_s: int = Field(
        default=8 * 3600, ge=60, le=7 * 24 * 3600, description="a sign-in lasts this long"
    )
    secure_cookie: bool | None = Field(
        default=None, description="mark the session cookie Secure; None = when the request came over https"
    )
    max_sign_in_failures: int = Field(
        default=10, ge=1, description="wrong tokens per minute (per process) before sign-in answers 429"
    )
