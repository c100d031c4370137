"""Runs count how often their metric rows changed other than by appending: a reader that keeps
decoded rows (``workbench.runs.metrics_cache``) then reads only the rows added since.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("runs", sa.Column("metrics_generation", BIGINT, nullable=False, server_default=sa.text("0")))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:  # SQLite drops a column by copying the table
        batch.drop_column("metrics_generation")
