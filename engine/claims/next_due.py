"""When a worker next has anything to do: one statement over all its tables.

For a table without a limit that is its earliest `wake_at` (leases count: a
claimed row's wake_at is its lease's end), a probe of its partial due index.
A limited table's due rows may be held back by their limit, so what counts
for it is its earliest future `wake_at` and the instant one of its groups
can next start (`engine.claims.limit_groups.ready_at`); and that it holds due
work back at all, so the worker looks again every poll_interval, as another
worker's finishing step may free a slot without a word.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Interval, Table, false, func, literal_column, select, true, union_all
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.base.clock import db_now
from engine.claims.floors import FLOOR_HORIZON, floor_bound
from engine.claims.limit_groups import ready_at
from engine.model.due import scheduled
from engine.model.registry import WorkflowInfo


@dataclass(frozen=True)
class NextDue:
    """The earliest instant a worker's tables have work, and how far off it is."""

    at: datetime
    seconds: float  # from this transaction's database time; <= 0 means due now
    held: bool = False  # a limit holds back work that is due already


async def next_due(
    conn: AsyncConnection,
    infos: Sequence[WorkflowInfo],
    steps: Sequence[tuple[str, ...] | None] | None = None,
    bucket: Table | None = None,
    floors: Sequence[datetime | None] | None = None,
    looking_again: bool = False,
) -> NextDue | None:
    """When the earliest work of `infos` (of `steps`, per table) comes due, or None.

    Asked after a claim, work due now that was not taken came due since, or
    another transaction held it. A table's floor (`engine.claims.floors`), if
    given, is where its due index is read from; `looking_again` (a worker that
    passes again by itself) stops a floored table's reading FLOOR_HORIZON past
    now, whose end is then the answer when nothing lies before it.
    """
    if not infos:
        return None
    served = tuple(steps) if steps is not None else tuple(None for _ in infos)
    bounds = tuple(floors) if floors is not None else tuple(None for _ in infos)
    floored = tuple(bound is not None for bound in bounds)
    params = {f"floor_{i}": bound for i, bound in enumerate(bounds) if bound is not None}
    statement = next_due_statement(tuple(infos), served, bucket, floored, looking_again)
    row = (await conn.execute(statement, params)).one()
    return None if row.at is None else NextDue(row.at, float(row.seconds), bool(row.held))


@lru_cache(maxsize=256)
def next_due_statement(
    infos: tuple[WorkflowInfo, ...],
    steps: tuple[tuple[str, ...] | None, ...],
    bucket: Table | None,
    floored: tuple[bool, ...] | None = None,
    looking_again: bool = False,
) -> Executable:
    """The earliest instant any of the tables has work, its distance, and whether held back."""
    bounded = floored if floored is not None else tuple(False for _ in infos)
    earliest = union_all(
        *(
            _earliest(info, served, bucket, f"floor_{i}" if floor else None, looking_again)
            for i, (info, served, floor) in enumerate(zip(infos, steps, bounded, strict=True))
        )
    ).subquery()
    at = func.min(earliest.c.at)
    return select(
        at.label("at"),
        func.extract("epoch", at - db_now()).label("seconds"),
        func.bool_or(earliest.c.held).label("held"),
    )


def _earliest(
    info: WorkflowInfo,
    steps: tuple[str, ...] | None,
    bucket: Table | None,
    floor: str | None,
    looking_again: bool = False,
) -> Any:
    """One table's earliest instant with work, and whether a limit holds due work back.

    `floor` names the bind a table without a limit reads its due index from;
    `looking_again` ends that reading at the horizon, the answer if nothing is before it.
    """
    table = info.table
    mine = scheduled(table.c.next_step, steps)
    if info.limit is None:
        earliest: Any = func.min(table.c.wake_at)
        if floor is not None:
            mine = mine & (table.c.wake_at >= floor_bound(floor))
            if looking_again:
                ahead = FLOOR_HORIZON.total_seconds()
                horizon = db_now() + literal_column(f"interval '{ahead:g} seconds'", Interval)
                mine = mine & (table.c.wake_at < horizon)
                earliest = func.coalesce(earliest, horizon)
        return select(earliest.label("at"), false().label("held")).where(mine)
    now = db_now()
    future = select(func.min(table.c.wake_at)).where(mine, table.c.wake_at > now)
    ready = ready_at(info, steps, bucket)
    # Some row is due now exactly when the earliest scheduled one is: one probe of the
    # due index's first entry, where EXISTS was planned as a scan that reads every row
    # when none is due.
    earliest = select(func.min(table.c.wake_at)).where(mine).scalar_subquery()
    due_now = earliest <= now
    # least() passes over NULLs: nothing in the future, or no group able to start.
    return select(
        func.least(future.scalar_subquery(), ready).label("at"),
        (due_now & func.coalesce(ready > now, true())).label("held"),
    )
