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

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import Integer, Interval, Row, bindparam, cast, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable
from sqlalchemy.sql.dml import Update

from engine.base.clock import db_now
from engine.base.driver import fetch
from engine.claims.floors import floor_bound
from engine.model.due import due, no_flush_wait
from engine.model.registry import WorkflowInfo

STATEMENT_CACHE_SIZE = 256  # claim statements kept built: tables x lanes served


@dataclass
class Claim:
    """A row this worker holds: which table, which key, and the version it may commit against.

    `lease_end` is the `claimed_until` this worker last wrote: it identifies
    the lease even after `run()` or `cancel()` moved the version on.
    """

    info: WorkflowInfo
    key: tuple[Any, ...]
    version: int
    lease_end: datetime | None = None
    scheduled_at: datetime | None = None  # the row's wake_at before this claim took it
    claimed_at: datetime | None = None  # the database clock when it was claimed
    claimed_clock: float = field(default_factory=time.monotonic)  # this process's, then

    def database_now(self) -> datetime | None:
        """The database clock now, from the claim's reading and the time since."""
        if self.claimed_at is None:
            return None
        return self.claimed_at + timedelta(seconds=time.monotonic() - self.claimed_clock)


def served_steps(
    info: WorkflowInfo, lanes: frozenset[str], *, listed: bool = False
) -> tuple[str, ...] | None:
    """The step names (aliases included) of `info` a worker serving `lanes` may take.

    None when it takes every step, so its claim filters on no step name: unless
    `listed`, for a worker that has met rows naming a step its code lacks, and
    must claim by the names it knows so as never to take them again.
    """
    served = tuple(sorted(name for name, step in info.named.items() if step.lane in lanes))
    return None if len(served) == len(info.named) and not listed else served


async def claim_due(
    conn: AsyncConnection,
    info: WorkflowInfo,
    limit: int,
    lease: timedelta,
    steps: tuple[str, ...] | None = None,
    floor: datetime | None = None,
) -> Sequence[Row[Any]]:
    """Lease up to `limit` due rows of one workflow table (of `steps`, if given).

    With a `floor` (`engine.claims.floors`) the claim reads the due index from there.
    """
    statement = claim_statement(info, steps, floor is not None)
    params: dict[str, Any] = {"limit": limit, "lease": lease}
    if floor is not None:
        params["floor"] = floor
    return await fetch(conn, statement, params)


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def claim_statement(
    info: WorkflowInfo, steps: tuple[str, ...] | None, floored: bool = False
) -> Executable:
    """The claim for one table, built once: building costs more than running it."""
    table = info.table
    pk = list(info.mapper.primary_key)
    # Due: something is scheduled and its time (or its last lease's end) has come,
    condition = due(table, steps)
    if floored:
        condition = condition & (table.c.wake_at >= floor_bound())
    rows = (
        select(*pk, table.c.wake_at)
        .where(condition, no_flush_wait())
        # oldest first, served by the partial index on (wake_at) WHERE next_step IS NOT NULL,
        .order_by(table.c.wake_at)
        .limit(bindparam("limit", type_=Integer))
        # and rows another worker is claiming right now are passed over, not waited for.
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    return lease_update(info, rows)


def lease_update(info: WorkflowInfo, rows: Any) -> Update:
    """Lease the rows of `rows` (a CTE of primary keys and wake_at): what every claim ends with."""
    table = info.table
    lease_end = db_now() + cast(bindparam("lease", type_=Interval), Interval)
    return (
        update(table)
        .where(*(column == rows.c[column.name] for column in info.mapper.primary_key))
        .values(
            # The fence moves on: a step still running from an older claim commits nothing.
            wf_version=table.c.wf_version + 1,
            claimed_until=lease_end,
            wake_at=lease_end,
        )
        # The occurrence this claim serves, for schedules that count from it.
        .returning(
            *table.c, rows.c.wake_at.label("duly_scheduled_at"), db_now().label("duly_claimed_at")
        )
    )
