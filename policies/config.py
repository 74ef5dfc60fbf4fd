"""Settings of the policies package, nested in the gateway settings as `settings.policies` (LLMGW_POLICIES__<FIELD>)."""

from pydantic import BaseModel


class PoliciesSettings(BaseModel):
    """Process-wide policies settings; per-tenant behaviour belongs in the policy instead."""
