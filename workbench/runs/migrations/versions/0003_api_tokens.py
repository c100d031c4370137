"""API tokens: the CLI's principal on a shared store (only a SHA-256 of each secret is kept).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

FLOAT = sa.Double().with_variant(sa.REAL(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "api_tokens",
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


def downgrade() -> None:
    op.drop_table("api_tokens")
