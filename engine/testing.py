"""Moving the database clock, so days of workflow time pass in milliseconds.

The shift is stored in the database, so every worker on it sees the moved
clock from its next pass; the NOTIFY that goes with it wakes sleeping workers
to recompute what is due.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from sqlalchemy import literal, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.sql import Executable

from engine.base.clock import clock
from engine.base.errors import InvalidArgumentError
from engine.base.notify import EVERYONE, notify
from engine.base.settings import MAX_DAYS
from engine.model.connection import activate, open_connection, session_engine
from engine.worker.loop import Worker
from engine.worker.options import WorkerOptions

# How far the clock may be from PostgreSQL's own time, in total: every instant duly computes
# from it (a due time, a cutoff, a search's reach back) stays on the calendar.
MAX_CLOCK_SHIFT = timedelta(days=MAX_DAYS)


async def move_clock(
    Session: async_sessionmaker[AsyncSession],
    by: timedelta,
) -> timedelta:
    """Move the database clock forward by `by` (backward if negative); return the new shift.

    An InvalidArgumentError, nothing moved, when the shift would pass MAX_CLOCK_SHIFT.
    """
    async with session_engine(Session).begin() as conn:
        shift: timedelta | None = None
        if abs(by) <= MAX_CLOCK_SHIFT:
            shift = (await conn.execute(move_clock_statement(by))).scalar()
        if shift is None:
            raise InvalidArgumentError(
                f"Moving the clock by {by} would take it more than {MAX_DAYS} days from "
                "PostgreSQL's own time: move it less, or reset it."
            )
        await conn.execute(notify(EVERYONE))
    return shift


def move_clock_statement(by: timedelta) -> Executable:
    """The clock's shift moved by `by` (the one row made if missing); the new shift.

    No row comes back when the shift would pass MAX_CLOCK_SHIFT: nothing is moved.
    """
    moved = clock.c.shift + literal(by)
    return (
        insert(clock)
        .values(id=1, shift=literal(by))
        .on_conflict_do_update(
            index_elements=["id"],
            set_={"shift": moved},
            where=moved.between(literal(-MAX_CLOCK_SHIFT), literal(MAX_CLOCK_SHIFT)),
        )
        .returning(clock.c.shift)
    )


async def reset_clock(Session: async_sessionmaker[AsyncSession]) -> None:
    """Put the database clock back on PostgreSQL's own time."""
    async with session_engine(Session).begin() as conn:
        await conn.execute(clock.delete())
        await conn.execute(notify(EVERYONE))


async def drain(
    Session: async_sessionmaker[AsyncSession],
    workflows: Iterable[type[Any]] | None = None,
    *,
    max_concurrency: int = 8,
) -> int:
    """Run every step that is due now, and what they make due now, until none is left.

    A deterministic worker for tests: no listener, no sleeping. Returns how
    many steps it started (a step that goes straight on to its next step
    counts once).
    """
    connection = await open_connection(Session, workflows)
    worker = Worker(connection, WorkerOptions(max_concurrency=max_concurrency, listen=False))
    async with activate(connection):
        return await worker.run_until_idle()


async def read_clock_shift(Session: async_sessionmaker[AsyncSession]) -> timedelta:
    """The database clock's current shift from PostgreSQL's time."""
    async with session_engine(Session).connect() as conn:
        shift = (await conn.execute(select(clock.c.shift))).scalar()
    return shift if shift is not None else timedelta(0)
