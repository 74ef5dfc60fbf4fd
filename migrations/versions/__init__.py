"""Alembic revisions (a package so that installs include them)."""
