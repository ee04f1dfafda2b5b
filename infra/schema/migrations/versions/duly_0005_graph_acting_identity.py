"""Graph workflows bound to who acts: who acted on a history row's behalf, self-approval.

`duly_graph_history.acted_by` names who acted when it is not the row's
actor (an admin acting for a user); `duly_graph_templates.forbid_self_approval`
refuses an instance's submitter every move and vote of it. Both are
additions: existing rows read as before (no one on behalf, allowed).

Revision ID: duly_0005
Revises: duly_0004
Create Date: 2026-12-01 21:55:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "duly_0005"
down_revision: str | Sequence[str] | None = "duly_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "duly_graph_templates",
        sa.Column("forbid_self_approval", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.add_column("duly_graph_history", sa.Column("acted_by", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("duly_graph_history", "acted_by")
    op.drop_column("duly_graph_templates", "forbid_self_approval")
