"""What "due" means: the conditions every claim and every next-due question share.

A row is *scheduled* while it names a next step, and *due* once its `wake_at`
(a timer, a retry's backoff, or the end of a lease) has come. A worker that
serves only some lanes asks for the steps it serves, which the row already
names, so routing costs nothing more. The conditions are written here once,
for a table or any alias of it, and so is the setting every claim shares.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, and_, func, select

from engine.base.clock import db_now


def scheduled(next_step: Any, steps: tuple[str, ...] | None = None) -> ColumnElement[bool]:
    """`next_step` (a column of a table or an alias) names a step: one of `steps`, or any."""
    # IN implies NOT NULL, and PostgreSQL proves it, so the partial due index still serves.
    result: ColumnElement[bool] = next_step.isnot(None) if steps is None else next_step.in_(steps)
    return result


def due(table: Any, steps: tuple[str, ...] | None = None, now: Any = None) -> ColumnElement[bool]:
    """Rows of `table` (or an alias) with a step of `steps` scheduled, whose time has come."""
    return and_(
        scheduled(table.c.next_step, steps),
        table.c.wake_at <= (db_now() if now is None else now),
    )


def no_flush_wait() -> ColumnElement[bool]:
    """Always true; evaluating it turns off, for this transaction, waiting for its WAL flush.

    A claim need not wait: one that a crash forgets only means the row is
    claimed again, and the step's commit against it is fenced.
    """
    setting = select(func.set_config("synchronous_commit", "off", True)).scalar_subquery()
    return setting.isnot(None)
