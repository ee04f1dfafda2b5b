"""The operators' audit trail: `duly_audit`, one row per action a person took.

Revision ID: duly_0008
Revises: duly_0007
Create Date: 2026-12-02 01:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "duly_0008"
down_revision: str | Sequence[str] | None = "duly_0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "duly_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("workflow", sa.Text(), nullable=True),
        sa.Column("subject", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("count", sa.Integer(), nullable=True),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.PrimaryKeyConstraint("id", name="duly_audit_pkey"),
    )
    op.create_index("ix_duly_audit_at", "duly_audit", ["at", "id"], unique=False)
    op.create_index("ix_duly_audit_workflow", "duly_audit", ["workflow", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_duly_audit_workflow", table_name="duly_audit")
    op.drop_index("ix_duly_audit_at", table_name="duly_audit")
    op.drop_table("duly_audit")
