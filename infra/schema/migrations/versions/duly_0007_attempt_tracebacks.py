"""A failed attempt's traceback and arguments: two nullable columns on the attempt log.

Adding a nullable column without a default rewrites nothing, so this takes only a brief
lock on `workflow_attempt`; every attempt logged before it reads NULL for both.

Revision ID: duly_0007
Revises: duly_0006
Create Date: 2026-12-02 01:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "duly_0007"
down_revision: str | Sequence[str] | None = "duly_0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("workflow_attempt", sa.Column("traceback", sa.Text(), nullable=True))
    op.add_column("workflow_attempt", sa.Column("args", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("workflow_attempt", "args")
    op.drop_column("workflow_attempt", "traceback")
