"""Alembic's environment: migrations run on the connection :mod:`service.db.migrate` passes in."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run the migrations through service.db.migrate (agentstream db upgrade)")
# Batch mode lets ALTER work on SQLite too (it copies the table), with no dialect switch here.
context.configure(connection=connection, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
