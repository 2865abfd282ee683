"""Alembic environment: always run programmatically by db.store on the store's own connection."""

from __future__ import annotations

from alembic import context

from db.models import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - the store always passes its connection
    raise RuntimeError("tunebench migrations run through db.store.RunStore, which passes a connection")

context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
