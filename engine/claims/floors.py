"""Where a worker's claims start reading the due index: below it lie only rows it already took.

A claim reads the due index in `wake_at` order, and every claim and commit
leaves an entry behind for the version it replaced. Vacuum removes them, but
not while a long transaction holds the xmin horizon back, and a claim reading
from the index's first entry then walks all of them. A worker remembers, per
table, a floor: the earliest due instant its last claim took, less a margin
for writers still committing. A probe off the pass loop looks below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    DateTime,
    Integer,
    Interval,
    bindparam,
    func,
    literal,
    literal_column,
    select,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.model.due import scheduled
from engine.model.registry import WorkflowInfo

# A writer whose transaction began this long before a claim and commits after it may
# leave a row due below the floor; the probe finds it (docs/architecture.md, "Floors").
FLOOR_MARGIN = timedelta(milliseconds=100)
# A floored next-due question of a worker nobody awaits reads no further than this past now:
# beyond lie the lease ends of steps already committed, which a held horizon keeps too.
FLOOR_HORIZON = timedelta(seconds=1)
# How far below its floor the probe of every second reads: a writer that committed late
# began its transaction within it. The whole range below is read less often.
PROBE_NEAR = timedelta(seconds=2)


def floor_bound(name: str = "floor") -> Any:
    """The bind a floored statement compares `wake_at` with."""
    return bindparam(name, type_=DateTime(timezone=True))


class DueFloors:
    """Per table, the instant below which this worker's claims no longer read."""

    def __init__(self) -> None:
        self._floors: dict[str, datetime] = {}

    def __bool__(self) -> bool:
        return bool(self._floors)

    def floor(self, name: str) -> datetime | None:
        """Where claims of table `name` start; None: at the due index's first entry."""
        return self._floors.get(name)

    def after_claim(self, name: str, rows: Sequence[Any]) -> None:
        """Raise the floor to the earliest due instant a claim took, less the margin.

        The claim read in `wake_at` order from the floor, so no row it could see
        lay due between the floor and the first one it took.
        """
        if not rows:
            return
        earliest = min(row.duly_scheduled_at for row in rows) - FLOOR_MARGIN
        current = self._floors.get(name)
        if current is None or earliest > current:
            self._floors[name] = earliest

    def lower(self, name: str, at: datetime) -> None:
        """Lower the floor to just below `at`, where a probe found a due row."""
        current = self._floors.get(name)
        if current is not None:
            self._floors[name] = min(current, at - FLOOR_MARGIN)

    def forget(self) -> None:
        """Read every table from its first entry again."""
        self._floors.clear()


async def probe_below(
    conn: AsyncConnection,
    floored: Sequence[tuple[WorkflowInfo, tuple[str, ...] | None, datetime]],
    near: bool = False,
) -> list[datetime | None]:
    """For each (table, steps, floor), the earliest scheduled `wake_at` below the floor, if
    any; `near`: only within PROBE_NEAR of it."""
    if not floored:
        return []
    statement = probe_statement(tuple((info, steps) for info, steps, _ in floored), near)
    params = {f"floor_{index}": floor for index, (_, _, floor) in enumerate(floored)}
    found: list[datetime | None] = [None] * len(floored)
    for row in await conn.execute(statement, params):
        found[row.position] = row.at
    return found


@lru_cache(maxsize=256)
def probe_statement(
    tables: tuple[tuple[WorkflowInfo, tuple[str, ...] | None], ...], near: bool = False
) -> Executable:
    """One statement asking every floored table for its earliest scheduled row below the floor
    (`near`: within PROBE_NEAR below it)."""
    parts = []
    for position, (info, steps) in enumerate(tables):
        table = info.table
        floor = floor_bound(f"floor_{position}")
        below = [scheduled(table.c.next_step, steps), table.c.wake_at < floor]
        if near:
            reach = literal_column(f"interval '{PROBE_NEAR.total_seconds():g} seconds'", Interval)
            below.append(table.c.wake_at >= floor - reach)
        parts.append(
            select(
                literal(position, Integer).label("position"),
                func.min(table.c.wake_at).label("at"),
            ).where(*below)
        )
    return union_all(*parts)
