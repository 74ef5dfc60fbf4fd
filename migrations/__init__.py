"""Alembic migrations of the gateway database; run them with `llmgw migrate` (policies.migrate)."""
