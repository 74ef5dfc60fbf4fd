"""Settings of the routing package, nested in the gateway settings as `settings.routing` (LLMGW_ROUTING__<FIELD>)."""

from pydantic import BaseModel


class RoutingSettings(BaseModel):
    """Process-wide routing settings; per-tenant behaviour belongs in the policy instead."""
