"""Claiming due work: the one way every kind of due row is taken.

A claim takes due rows with `FOR UPDATE SKIP LOCKED`, so workers never wait
for each other or take the same row, and in the same statement bumps each
row's `wf_version` (the fence its step will commit against) and leases it:
`claimed_until` and `wake_at` both move to the end of the lease. Keeping a
claimed row's `wake_at` at its lease's end is what makes a dead worker's row
due again by itself, and lets one question, "the earliest `wake_at`", answer
when this worker next has anything to do, leases included.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Interval,
    Row,
    bindparam,
    cast,
    func,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable
from sqlalchemy.sql.dml import Update

from engine.clock import db_now
from engine.workflow import WorkflowInfo


def served_steps(info: WorkflowInfo, lanes: frozenset[str]) -> tuple[str, ...] | None:
    """The steps of `info` a worker serving `lanes` may take; None when it takes them all."""
    served = tuple(sorted(name for name, step in info.steps.items() if step.lane in lanes))
    return None if len(served) == len(info.steps) else served


def scheduled(info: WorkflowInfo, steps: tuple[str, ...] | None) -> ColumnElement[bool]:
    """Rows with a step scheduled, of the steps this worker serves (all when None)."""
    return served(info.table.c.next_step, steps)


def served(next_step: Any, steps: tuple[str, ...] | None) -> ColumnElement[bool]:
    """`next_step` (of a table or an alias of it) names one of `steps` (any step when None)."""
    # Routing costs nothing more: the row already names the step it runs next.
    result: ColumnElement[bool] = next_step.isnot(None) if steps is None else next_step.in_(steps)
    return result


async def claim_due(
    conn: AsyncConnection,
    info: WorkflowInfo,
    limit: int,
    lease: timedelta,
    steps: tuple[str, ...] | None = None,
) -> Sequence[Row[Any]]:
    """Lease up to `limit` due rows of one workflow table (of `steps`, if given)."""
    statement = _claim_statement(info, steps)
    return (await conn.execute(statement, {"limit": limit, "lease": lease})).all()


@lru_cache(maxsize=256)
def _claim_statement(info: WorkflowInfo, steps: tuple[str, ...] | None) -> Executable:
    """The claim for one table, built once: building costs more than running it."""
    table = info.table
    pk = list(info.mapper.primary_key)
    due = (
        select(*pk, table.c.wake_at)
        # Due: something is scheduled and its time (or its last lease) has come,
        .where(table.c.next_step.isnot(None), scheduled(info, steps), table.c.wake_at <= db_now())
        # oldest first, served by the partial index on (wake_at) WHERE next_step IS NOT NULL,
        .order_by(table.c.wake_at)
        .limit(bindparam("limit", type_=Integer))
        # A claim need not wait for its WAL flush: one lost in a crash only means the
        # row is claimed again, and the step's commit against it is fenced.
        .where(
            select(func.set_config("synchronous_commit", "off", True)).scalar_subquery().isnot(None)
        )
        # and rows another worker is claiming right now are passed over, not waited for.
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    return lease_update(info, due)


def lease_update(info: WorkflowInfo, due: Any) -> Update:
    """Lease the rows of `due` (a CTE of primary keys and wake_at): what every claim ends with."""
    table = info.table
    lease_end = db_now() + cast(bindparam("lease", type_=Interval), Interval)
    return (
        update(table)
        .where(*(column == due.c[column.name] for column in info.mapper.primary_key))
        .values(
            # The fence moves on: a step still running from an older claim commits nothing.
            wf_version=table.c.wf_version + 1,
            claimed_until=lease_end,
            wake_at=lease_end,
        )
        # The occurrence this claim serves, for schedules that count from it.
        .returning(
            *table.c, due.c.wake_at.label("duly_scheduled_at"), db_now().label("duly_claimed_at")
        )
    )
