"""The database clock: PostgreSQL's now() plus a shift that tests move.

Every due time, lease and deadline is compared with `db_now()`, never with
Python's clock, so every worker on one database agrees on what is due, and a
test can make three days pass by moving the shift. The shift lives in a
one-row table, `duly_clock`, added to the metadata of every base that maps a
workflow or declares its engine tables (`engine.tables`), so `create_all` and
Alembic carry it with the user's tables.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Column,
    ColumnElement,
    DateTime,
    Interval,
    MetaData,
    SmallInteger,
    Table,
    column,
    func,
    select,
    table,
    text,
)
from sqlalchemy.sql.elements import ColumnElement as _ColumnElement

CLOCK_TABLE = "duly_clock"
# A column's `info` key: whatever value a step sets on it, its commit writes db_now() instead.
DATABASE_TIME = "duly_database_time"

# A lightweight handle for queries, independent of whichever metadata owns the table.
clock = table(CLOCK_TABLE, column("id"), column("shift"))


def declare_clock_table(metadata: MetaData) -> Table:
    """Add `duly_clock` to `metadata` (once) so schema tools create it."""
    existing = metadata.tables.get(CLOCK_TABLE)
    if existing is not None:
        return existing
    return Table(
        CLOCK_TABLE,
        metadata,
        Column("id", SmallInteger, primary_key=True, server_default=text("1")),
        Column("shift", Interval, nullable=False, server_default=text("interval '0'")),
        CheckConstraint("id = 1", name="duly_clock_one_row"),
    )


def clock_shift() -> ColumnElement[object]:
    """The current shift, zero when the table has no row."""
    return func.coalesce(select(clock.c.shift).scalar_subquery(), text("interval '0'"))


def db_now() -> _ColumnElement[object]:
    """The database's time for this transaction, shifted: the only clock duly reads."""
    return (func.now() + clock_shift()).cast(DateTime(timezone=True))


def db_clock_now() -> _ColumnElement[object]:
    """Like db_now() but the wall time of the statement, for computing how long to sleep."""
    return (func.clock_timestamp() + clock_shift()).cast(DateTime(timezone=True))


def written_as_database_time(column: Column[Any]) -> bool:
    """Whether a step's commit writes `column` as db_now() (it is declared DATABASE_TIME)."""
    return bool(column.info.get(DATABASE_TIME))
