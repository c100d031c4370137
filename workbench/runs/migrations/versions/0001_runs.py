"""The run store as it was before Alembic: runs, their per-step payload tables, the seed index.

Revision ID: 0001
Revises:
Create Date: 2026-11-26

An empty database gets the tables. A SQLite file made before migrations were Alembic's (no
``alembic_version`` table) already holds some of them: this revision completes it as the store's
own ``_migrate`` used to (``PRAGMA user_version`` 0-2): the columns newer than the file are added,
runs made before arms existed get their name as arm and their recipe's ``train.seed`` as seed,
and the partial unique index on (grp, arm, seed) is made, unless the file already holds two
runs with the same group, arm and seed (launched at once before the index existed): then the
index is left out, the pairs are logged, and the store makes it on the first open after they
are gone (``RunStore``). The tables are spelled out here (not imported): a revision must not
change when the current schema does.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

log = logging.getLogger("workbench.runs.store")

FLOAT = sa.Double().with_variant(sa.REAL(), "sqlite")
BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UNIQUE_SEED_INDEX = "runs_grp_arm_seed"
PAYLOAD_TABLES = ("metrics", "samples", "diagnostics", "lens")


def _runs_columns() -> list[sa.Column]:
    return [
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
    ]


# columns some pre-Alembic files lack (added by the store's ALTER TABLEs of that time)
ADDED_COLUMNS = ("skipped_events", "warnings", "arm", "seed", "sweep", "events_inode")


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    if not inspector.has_table("runs"):
        op.create_table("runs", *_runs_columns())
    else:
        present = {c["name"] for c in inspector.get_columns("runs")}
        for column in _runs_columns():
            if column.name in ADDED_COLUMNS and column.name not in present:
                op.add_column("runs", column)
    indexes = {i["name"] for i in inspector.get_indexes("runs")} if inspector.has_table("runs") else set()
    for name, column in (("runs_status", "status"), ("runs_grp", "grp")):
        if name not in indexes:
            op.create_index(name, "runs", [column])
    for name in PAYLOAD_TABLES:
        if not inspector.has_table(name):
            op.create_table(name, sa.Column("run_id", sa.Text, primary_key=True),
                            sa.Column("step", BIGINT, primary_key=True), sa.Column("time", FLOAT),
                            sa.Column("data", sa.Text), sqlite_with_rowid=False)
    _fill_arms(bind)
    if UNIQUE_SEED_INDEX not in indexes:
        _make_unique_seed_index(bind)
    if bind.dialect.name == "sqlite":
        op.execute("PRAGMA user_version = 2")  # what the store before Alembic wrote: older code opens it as current


def _fill_arms(bind) -> None:
    """Runs made before arms existed: their name is their arm, their recipe's seed their seed."""
    from workbench.runs.store import recipe_seed

    runs = sa.table("runs", sa.column("id"), sa.column("name"), sa.column("recipe"), sa.column("arm"), sa.column("seed"))
    for row in bind.execute(sa.select(runs.c.id, runs.c.name, runs.c.recipe).where(runs.c.arm.is_(None))).all():
        bind.execute(sa.update(runs).where(runs.c.id == row.id, runs.c.arm.is_(None))
                     .values(arm=row.name, seed=recipe_seed(row.recipe)))


def _make_unique_seed_index(bind) -> None:
    runs = sa.table("runs", sa.column("id"), sa.column("grp"), sa.column("arm"), sa.column("seed"))
    duplicates = bind.execute(sa.select(runs.c.grp, runs.c.arm, runs.c.seed)
                              .where(runs.c.grp.is_not(None), runs.c.seed.is_not(None))
                              .group_by(runs.c.grp, runs.c.arm, runs.c.seed).having(sa.func.count() > 1)).all()
    if duplicates:
        log.warning("run store: runs share a group, arm and seed, so seeds are not unique per arm there "
                    "(`compare` gives no verdict for such a group until all but one run of each seed are deleted): %s",
                    "; ".join(f"{d.grp}/{d.arm}/seed {d.seed}" for d in duplicates[:10]))
        return
    op.create_index(UNIQUE_SEED_INDEX, "runs", ["grp", "arm", "seed"], unique=True,
                    sqlite_where=sa.text("grp IS NOT NULL"), postgresql_where=sa.text("grp IS NOT NULL"))


def downgrade() -> None:
    for name in PAYLOAD_TABLES:
        op.drop_table(name)
    op.drop_table("runs")
