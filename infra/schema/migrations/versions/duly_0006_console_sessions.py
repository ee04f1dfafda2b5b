"""The console's login sessions: `duly_console_sessions`, one row a login, by its cookie's digest.

Revision ID: duly_0006
Revises: duly_0005
Create Date: 2026-12-01 21:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "duly_0006"
down_revision: str | Sequence[str] | None = "duly_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "duly_console_sessions",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("principal_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column(
            "roles", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False
        ),
        sa.Column(
            "groups", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False
        ),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("credential", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("id ~ '^[0-9a-f]{64}$'", name="duly_console_sessions_id_digest"),
        sa.CheckConstraint("expires_at > created_at", name="duly_console_sessions_expiry"),
        sa.PrimaryKeyConstraint("id", name="duly_console_sessions_pkey"),
    )
    op.create_index(
        "ix_duly_console_sessions_expires",
        "duly_console_sessions",
        ["expires_at", "id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_duly_console_sessions_expires", table_name="duly_console_sessions")
    op.drop_table("duly_console_sessions")
