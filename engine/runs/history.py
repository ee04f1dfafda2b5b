"""Reading what a run has tried: `row.history()`, from the attempt log its commits wrote."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select

from engine.base.errors import NotFoundError
from engine.model.attempt_log import run_key
from engine.model.connection import current_connection


async def read_history(row: Any) -> list[Any]:
    """The attempts of `row`'s run, oldest first, read with the connected session."""
    connection = current_connection()
    log = connection.attempt_log
    if log is None:
        raise NotFoundError("No AttemptLog is mapped: map one on your base to keep history.")
    async with connection.sessionmaker() as session:
        result = await session.scalars(history_statement(log, type(row).__table__.name, row))
        return list(result.all())


def history_statement(log: type[Any], workflow: str, row: Any) -> Select[Any]:
    """The attempt-log rows of one run, oldest first (by the log's (workflow, run_key) index)."""
    return select(log).where(log.workflow == workflow, log.run_key == run_key(row)).order_by(log.id)
