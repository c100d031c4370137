"""Schema migrations of the run store with Alembic (``workbench/runs/migrations``), run on open.

``RunStore`` reads the store's revision when it opens (reading never writes; Alembic itself is
imported only when there is something to migrate); only a store behind ``HEAD`` is migrated,
inside one write transaction that first takes the store's migration lock (SQLite: ``BEGIN
IMMEDIATE``; PostgreSQL: an advisory lock, and its DDL is transactional), so two processes opening
a new or old store at once migrate it once and neither sees half a schema.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
HEAD = "0004"  # the newest revision in migrations/versions (a test checks it is Alembic's head)
VERSION_TABLE = "alembic_version"  # where Alembic keeps a store's revision


def alembic_config(connection: Connection | None = None):
    """Alembic's configuration for the store's migrations, running on ``connection``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def current_revision(connection: Connection) -> str | None:
    """The store's revision (None: empty, or made before its migrations were Alembic's); reads only."""
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    return connection.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def upgrade(connection: Connection, revision: str = "head") -> None:
    """Migrate to ``revision`` inside the transaction ``connection`` has begun (the caller holds
    the migration lock); Alembic runs every step in that transaction."""
    from alembic import command

    command.upgrade(alembic_config(connection), revision)
