"""The last hour of work: steps attempted and failed a minute, per workflow, from the attempt log.

    recent = await activity(connection)
    recent.steps["onboarding"]      # a count a minute, oldest first
    recent.total()                  # steps and failures over the hour, every workflow

The console's overview draws it (a chart, and a line a workflow). It reads
only the hour's attempts, through the log's key (see `activity_statement`),
and nothing when no AttemptLog is mapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import Select, Table, func, select

from engine.base.clock import db_now
from engine.model.connection import WorkflowConnection
from engine.views.run import database_now

ACTIVITY_MINUTES = 60  # how far back activity() looks
# Attempts activity() reads at most: a busier hour shows its latest part (`truncated`).
ACTIVITY_ATTEMPTS = 100_000


@dataclass(frozen=True)
class Activity:
    """Steps attempted and failed a minute, per workflow, over the last ACTIVITY_MINUTES."""

    now: datetime  # the database's time
    minutes: list[datetime]  # the start of each minute, oldest first
    steps: dict[str, list[int]] = field(default_factory=dict)  # workflow -> a count a minute
    failures: dict[str, list[int]] = field(default_factory=dict)  # retried or failed attempts
    truncated: bool = False  # more attempts than ACTIVITY_ATTEMPTS: the oldest minutes are short

    def total(self, workflow: str | None = None) -> tuple[int, int]:
        """Steps and failures over the whole window, of one workflow or of all."""
        names = [workflow] if workflow is not None else list(self.steps)
        steps = sum(sum(self.steps.get(name, [])) for name in names)
        failures = sum(sum(self.failures.get(name, [])) for name in names)
        return steps, failures


@lru_cache(maxsize=16)
def activity_statement(table: Table) -> Select[Any]:
    """Attempts per workflow and minute over the last ACTIVITY_MINUTES, through the log's key.

    The log is appended in key order with the database's time, so the
    window's attempts are the newest keys: the first statement finds the key
    where the window starts (reading newest first, stopping at the first
    attempt older than the window, never past ACTIVITY_ATTEMPTS), the second
    reads the keys after it. Neither reads the rest of the log.
    """
    c = table.c
    now = db_now()
    since = now - timedelta(minutes=ACTIVITY_MINUTES)
    newest = select(c.id, c.finished_at).order_by(c.id.desc()).limit(ACTIVITY_ATTEMPTS)
    newest_rows = newest.subquery("newest")
    # The newest attempt older than the window: where the window starts (lazy: the LIMIT 1
    # stops the backward read at the first such row).
    boundary = (
        select(newest_rows.c.id).where(newest_rows.c.finished_at < since).limit(1).scalar_subquery()
    )
    window = (
        select(c.workflow, c.finished_at, c.outcome)
        .where(c.id > func.coalesce(boundary, 0))
        .order_by(c.id.desc())
        .limit(ACTIVITY_ATTEMPTS)
        .subquery("window")
    )
    minute = func.date_trunc("minute", window.c.finished_at)
    return (
        select(
            window.c.workflow,
            minute.label("minute"),
            func.count().label("steps"),
            func.count().filter(window.c.outcome != "ok").label("failures"),
        )
        # A clock moved back leaves attempts "in the future": not in this hour.
        .where(window.c.finished_at >= since, window.c.finished_at <= now)
        .group_by(window.c.workflow, minute)
    )


async def activity(connection: WorkflowConnection) -> Activity:
    """Steps and failures per minute and workflow over the last hour (empty without a log)."""
    async with connection.autocommit.connect() as conn:
        now = await database_now(conn)
        log = connection.attempt_log
        rows = [] if log is None else (await conn.execute(activity_statement(log.__table__))).all()
    current = now.replace(second=0, microsecond=0)
    minutes = [current - timedelta(minutes=n) for n in range(ACTIVITY_MINUTES - 1, -1, -1)]
    index = {minute: n for n, minute in enumerate(minutes)}
    names = [info.name for info in connection.workflows]
    steps = {name: [0] * ACTIVITY_MINUTES for name in names}
    failures = {name: [0] * ACTIVITY_MINUTES for name in names}
    for row in rows:
        slot = index.get(row.minute.astimezone(now.tzinfo))
        if slot is None or row.workflow not in steps:
            continue
        steps[row.workflow][slot] += row.steps
        failures[row.workflow][slot] += row.failures
    read = sum(row.steps for row in rows)  # every attempt read was in the hour: maybe more were
    return Activity(now, minutes, steps, failures, truncated=read >= ACTIVITY_ATTEMPTS)
