"""The admin REST API (/admin/v1): tenants, keys, policies, model aliases, usage, cache flush."""
