"""Alembic environment: runs on the connection that policies.migrate hands over."""

from alembic import context

from policies.tables import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through policies.migrate (llmgw migrate), not the alembic CLI")

context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
