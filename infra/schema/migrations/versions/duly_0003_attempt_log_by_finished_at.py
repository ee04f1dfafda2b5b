"""The attempt log by finished_at: the index `duly prune` walks its batches by.

On a large attempt log, CREATE INDEX blocks every step's commit (each writes
its attempt row) until the index is built. Build it first without blocking,
`CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_workflow_attempt_finished ON
workflow_attempt (finished_at, id)`, and this revision then finds it there.

Revision ID: duly_0003
Revises: duly_0002
Create Date: 2026-12-01 08:20:52.766262
"""

from collections.abc import Sequence

from alembic import op

revision: str = "duly_0003"
down_revision: str | Sequence[str] | None = "duly_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_workflow_attempt_finished",
        "workflow_attempt",
        ["finished_at", "id"],
        unique=False,
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_workflow_attempt_finished", table_name="workflow_attempt")
