"""Reading what a run has tried: `row.history()`, from the attempt log its commits wrote."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from engine.attempt_log import run_key
from engine.connection import current_connection
from engine.errors import NotFoundError


async def read_history(row: Any) -> list[Any]:
    """The attempts of `row`'s run, oldest first, read with the connected session."""
    connection = current_connection()
    log = connection.attempt_log
    if log is None:
        raise NotFoundError("No AttemptLog is mapped: map one on your base to keep history.")
    async with connection.sessionmaker() as session:
        result = await session.scalars(
            select(log)
            .where(log.workflow == type(row).__table__.name, log.run_key == run_key(row))
            .order_by(log.id)
        )
        return list(result.all())
