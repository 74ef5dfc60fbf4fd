"""Process-wide settings of this package, nested in the gateway settings (LLMGW_CACHE__<FIELD>)."""

from pydantic import BaseModel


class CacheSettings(BaseModel):
    """Process-wide cache settings; per-tenant behaviour belongs in the policy instead."""
