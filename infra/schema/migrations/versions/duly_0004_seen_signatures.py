"""The signatures already taken: `duly_seen_signatures`, so a signed request is taken once.

IF NOT EXISTS, as duly's other own tables: a database made with `create_all`
(`duly dev`) has it already.

Revision ID: duly_0004
Revises: duly_0003
Create Date: 2026-12-01 22:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "duly_0004"
down_revision: str | Sequence[str] | None = "duly_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "duly_seen_signatures",
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("octet_length(digest) = 32", name="duly_seen_signatures_sha256"),
        sa.PrimaryKeyConstraint("digest"),
        if_not_exists=True,
    )
    op.create_index(
        "ix_duly_seen_signatures_expires",
        "duly_seen_signatures",
        ["expires_at", "digest"],
        unique=False,
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_duly_seen_signatures_expires", table_name="duly_seen_signatures")
    op.drop_table("duly_seen_signatures")
