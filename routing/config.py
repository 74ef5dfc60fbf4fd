"""Process-wide settings of this package, nested in the gateway settings (LLMGW_ROUTING__<FIELD>)."""

from pydantic import BaseModel


class RoutingSettings(BaseModel):
    """Process-wide routing settings; per-tenant behaviour belongs in the policy instead."""
