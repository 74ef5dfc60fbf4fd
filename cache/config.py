"""Settings of the cache package, nested in the gateway settings as `settings.cache` (LLMGW_CACHE__<FIELD>)."""

from pydantic import BaseModel


class CacheSettings(BaseModel):
    """Process-wide cache settings; per-tenant behaviour belongs in the policy instead."""
