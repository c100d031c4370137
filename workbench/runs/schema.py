"""The run store's tables as SQLAlchemy Core ``Table``s: one metadata for SQLite and PostgreSQL.

This is the schema at the newest migration (``workbench/runs/migrations``): the store's queries
are written against it, and a test checks that migrating an empty database gives exactly these
tables (Alembic's autogenerate comparison finds no difference) on both backends. The migrations
spell their own tables out: a revision must not change when this module does.

Types that differ between the backends are named once here: a float is ``DOUBLE PRECISION`` on
PostgreSQL (its ``REAL`` is 4 bytes) and ``REAL`` (8 bytes) on SQLite; integers that can pass 2^31
(event offsets, steps) are ``BIGINT`` on PostgreSQL and ``INTEGER`` (8 bytes) on SQLite.
"""

from __future__ import annotations

import sqlalchemy as sa

FLOAT = sa.Double().with_variant(sa.REAL(), "sqlite")
BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

UNIQUE_SEED_INDEX = "runs_grp_arm_seed"
PAYLOAD_TABLES = ("metrics", "samples", "diagnostics", "lens")  # every table keyed by (run, step)

metadata = sa.MetaData()

runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("algorithm", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("launcher", sa.Text, nullable=False),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("created_by", sa.Text, nullable=False),
    sa.Column("created_at", FLOAT, nullable=False),
    sa.Column("started_at", FLOAT),
    sa.Column("ended_at", FLOAT),
    sa.Column("grp", sa.Text),
    sa.Column("tags", sa.Text, nullable=False, server_default="[]"),
    sa.Column("notes", sa.Text, nullable=False, server_default=""),
    sa.Column("recipe", sa.Text, nullable=False),
    sa.Column("run_dir", sa.Text, nullable=False),
    sa.Column("launch", sa.Text, nullable=False, server_default="{}"),
    sa.Column("handle", sa.Text, nullable=False, server_default="{}"),
    sa.Column("events_offset", BIGINT, nullable=False, server_default=sa.text("0")),
    sa.Column("events_inode", sa.Text),
    sa.Column("last_step", BIGINT, nullable=False, server_default=sa.text("-1")),
    sa.Column("total_steps", BIGINT, nullable=False),
    sa.Column("reward", FLOAT),
    sa.Column("error", sa.Text),
    sa.Column("cancel_requested", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column("skipped_events", BIGINT, nullable=False, server_default=sa.text("0")),
    sa.Column("warnings", sa.Text, nullable=False, server_default="[]"),
    sa.Column("arm", sa.Text),
    sa.Column("seed", BIGINT),
    sa.Column("sweep", sa.Text, nullable=False, server_default="{}"),
    # +1 whenever the run's metric rows change other than by a row past its last step (a resume
    # drops the steps it redoes): a reader keeping decoded rows then re-reads the run (metrics_cache)
    sa.Column("metrics_generation", BIGINT, nullable=False, server_default=sa.text("0")),
    sa.Index("runs_status", "status"),
    sa.Index("runs_grp", "grp"),
    # seeds are unique per arm of a group (a store made before this index may lack it: see RunStore)
    sa.Index(UNIQUE_SEED_INDEX, "grp", "arm", "seed", unique=True, sqlite_where=sa.text("grp IS NOT NULL"),
             postgresql_where=sa.text("grp IS NOT NULL")),
)


def _payload_table(name: str) -> sa.Table:
    """One row per (run, step): the event's time and its payload as JSON text."""
    return sa.Table(name, metadata,
                    sa.Column("run_id", sa.Text, primary_key=True),
                    sa.Column("step", BIGINT, primary_key=True),
                    sa.Column("time", FLOAT),
                    sa.Column("data", sa.Text),
                    sqlite_with_rowid=False)


payloads: dict[str, sa.Table] = {name: _payload_table(name) for name in PAYLOAD_TABLES}

audit = sa.Table(
    "audit", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", FLOAT, nullable=False),
    sa.Column("actor", sa.Text, nullable=False),
    sa.Column("role", sa.Text, nullable=False, server_default=""),
    sa.Column("auth", sa.Text, nullable=False, server_default=""),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False, server_default=""),
    sa.Column("detail", sa.Text, nullable=False, server_default=""),
    sa.Column("address", sa.Text, nullable=False, server_default=""),
    sa.Index("audit_at", "at"),
)

api_tokens = sa.Table(
    "api_tokens", metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("secret_sha256", sa.Text, nullable=False, unique=True),
    sa.Column("user_name", sa.Text, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("label", sa.Text, nullable=False, server_default=""),
    sa.Column("created_by", sa.Text, nullable=False),
    sa.Column("created_at", FLOAT, nullable=False),
    sa.Column("expires_at", FLOAT, nullable=False),
    sa.Column("last_used_at", FLOAT, nullable=True),
    sa.Column("revoked_at", FLOAT, nullable=True),
)
