"""What a run has tried: one AttemptLog row per attempt, written in the step's commit.

The application maps `AttemptLog` on its own base, so its migrations carry the
table; a deployment that maps none pays nothing. Nothing in the engine reads
this table except `row.history()`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, DateTime, Float, Index, Integer, String, Table, Text, select
from sqlalchemy.orm import Mapped, class_mapper, mapped_column

from engine.errors import NotFoundError

if TYPE_CHECKING:
    from engine.workflow import WorkflowMethods

OUTCOMES = ("ok", "retry", "failed")

_log_classes: list[type[Any]] = []


def attempt_log_classes() -> list[type[Any]]:
    """Every AttemptLog class mapped in this process."""
    return list(_log_classes)


def run_key(row: object) -> str:
    """The run's primary key as the text the attempt log stores."""
    values = class_mapper(type(row)).primary_key_from_instance(row)
    return json.dumps(values[0] if len(values) == 1 else list(values), default=str)


class AttemptLogColumns:
    """The attempt log's columns and registration, shared by both spellings."""

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        table = cls.__dict__.get("__table__")
        if isinstance(table, Table):
            Index(f"ix_{table.name}_run"[:63], table.c.workflow, table.c.run_key, table.c.id)
            _log_classes.append(cls)


class AttemptLog(AttemptLogColumns):
    """Map onto your own base to keep a row per step attempt."""

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    workflow: Mapped[str] = mapped_column(String(63))
    run_key: Mapped[str] = mapped_column(Text)
    step: Mapped[str] = mapped_column(String(200))
    attempt: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    took_ms: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


async def read_history(row: WorkflowMethods) -> list[Any]:
    """The attempts of `row`'s run, oldest first, read with the connected session."""
    from engine.connection import current_connection

    connection = current_connection()
    log = connection.attempt_log
    if log is None:
        raise NotFoundError("No AttemptLog is mapped: map one on your base to keep history.")
    async with connection.sessionmaker() as session:
        result = await session.scalars(
            select(log)
            .where(log.workflow == type(row).__table__.name, log.run_key == run_key(row))  # type: ignore[attr-defined]
            .order_by(log.id)
        )
        return list(result.all())
