"""Process-wide settings of this package, nested in the gateway settings (LLMGW_POLICIES__<FIELD>)."""

from pydantic import BaseModel


class PoliciesSettings(BaseModel):
    """Process-wide policies settings; per-tenant behaviour belongs in the policy instead."""
