"""Alembic's environment for the run store: migrations run on the connection the store hands in
(``config.attributes["connection"]``), inside the transaction the store has already begun under
its migration lock (``workbench.runs.migrate.upgrade``), so two processes opening a new or old
store at once migrate it once."""

from alembic import context

from workbench.runs.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
