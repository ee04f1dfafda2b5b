"""The attempt log partitioned a UTC day a partition by finished_at, pruned by dropping days.

Its rows are not rewritten: the old table becomes one partition, up to the end of the
UTC day of its newest row, and is dropped whole once past the retention period (it
builds one index, the primary key with finished_at, over them). Downgrading copies the
rows back into a plain table. See `engine.partitions.converting`.

Revision ID: duly_0009
Revises: duly_0008
Create Date: 2026-12-02 04:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

from engine import partition_attempt_log, unpartition_attempt_log

revision: str = "duly_0009"
down_revision: str | Sequence[str] | None = "duly_0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "workflow_attempt"


def upgrade() -> None:
    for statement in partition_attempt_log(TABLE):
        op.execute(statement)


def downgrade() -> None:
    for statement in unpartition_attempt_log(TABLE):
        op.execute(statement)
