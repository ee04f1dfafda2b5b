"""Stranded runs: due for longer than a grace period, and no worker has taken them.

`stranded_runs` reads the rows alone, through each table's partial due index, so it needs
no code of the steps: due rows older than the database clock minus the grace
(`DULY_STRANDED_AFTER_SECONDS`), counted by step. A worker's `StrandedWatch` asks only about
the steps it handed back, one grace period after it met them and every grace period after,
and sets the `duly_stranded_runs` gauge. Why rows strand: docs/architecture.md, "Rolling
deploys".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import Interval, Select, bindparam, cast, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.base.clock import db_now
from engine.base.settings import STRANDED_AFTER_SECONDS
from engine.model.connection import WorkflowConnection
from engine.model.due import scheduled
from engine.model.registry import WorkflowInfo
from engine.model.telemetry import runs_stranded

log = logging.getLogger("duly.worker")

STRANDED_AFTER = timedelta(seconds=STRANDED_AFTER_SECONDS.default)  # due this long: stranded
STRANDED_AFTER_SETTING = STRANDED_AFTER_SECONDS.name


def stranded_after(environ: Mapping[str, str] | None = None) -> timedelta:
    """The grace period, from `DULY_STRANDED_AFTER_SECONDS` (a positive number of seconds)."""
    return timedelta(seconds=STRANDED_AFTER_SECONDS.read(environ))


@dataclass(frozen=True)
class StrandedRuns:
    """Runs of one workflow due at one step for longer than the grace period."""

    workflow: str
    step: str
    runs: int
    since: datetime  # the oldest of them has been due since then

    def to_dict(self) -> dict[str, Any]:
        """As JSON values (the instant in ISO 8601)."""
        return {
            "workflow": self.workflow,
            "step": self.step,
            "runs": self.runs,
            "since": self.since.isoformat(),
        }


@lru_cache(maxsize=256)
def stranded_statement(info: WorkflowInfo, steps: tuple[str, ...] | None = None) -> Select[Any]:
    """Per step (of `steps`, or any): how many rows have been due for longer than :grace, and
    since when the oldest has.

    `wake_at < now - grace` is a range of the partial due index (`wake_at`
    where a step is scheduled), so only the rows that old are read. A leased
    row's `wake_at` is its lease's end: a running step is not stranded, and
    the row of a worker that died is once its lease has been over that long.
    """
    table = info.table
    cutoff = db_now() - cast(bindparam("grace", type_=Interval), Interval)
    return (
        select(
            table.c.next_step.label("step"),
            func.count().label("runs"),
            func.min(table.c.wake_at).label("since"),
        )
        .where(scheduled(table.c.next_step, steps), table.c.wake_at < cutoff)
        .group_by(table.c.next_step)
        .order_by(table.c.next_step)
    )


async def stranded_in(
    conn: AsyncConnection,
    info: WorkflowInfo,
    grace: timedelta,
    steps: tuple[str, ...] | None = None,
) -> list[StrandedRuns]:
    """The stranded runs of one table (at `steps`, if given), by step."""
    result = await conn.execute(stranded_statement(info, steps), {"grace": grace})
    return [StrandedRuns(info.name, row.step, row.runs, row.since) for row in result]


async def stranded_runs(
    connection: WorkflowConnection, grace: timedelta | None = None
) -> list[StrandedRuns]:
    """Every workflow table's stranded runs, by workflow and step (one statement a table).

    `grace` defaults to the setting (`stranded_after()`).
    """
    period = stranded_after() if grace is None else grace
    found: list[StrandedRuns] = []
    async with connection.autocommit.connect() as conn:
        for info in connection.workflows:
            found.extend(await stranded_in(conn, info, period))
    return found


class StrandedWatch:
    """What a worker remembers of the steps it handed back unrun, and when it looks again.

    Instants are the database's: the first check is due when the oldest row
    handed back has been due for the grace period, the next ones a grace
    period apart. The worker tells `observe` each database time it reads (a
    claim's, a next-due answer's) and the watch counts on from there with
    this process's clock, so a moved test clock is seen at the next reading.
    """

    def __init__(self, grace: timedelta) -> None:
        self.grace = grace
        self._steps: dict[WorkflowInfo, set[str]] = {}
        self._check_at: datetime | None = None
        self._reading: tuple[datetime, float] | None = None  # database time, monotonic then
        self.checks = 0  # how many checks were made

    @property
    def watching(self) -> bool:
        """Whether any step was handed back: only then does the worker read time for us."""
        return bool(self._steps)

    def handed_back(
        self, info: WorkflowInfo, step: str, due_since: datetime | None, now: datetime | None
    ) -> None:
        """A row of `info` at `step` was handed back; warn the first time for this step."""
        if now is not None:
            self.observe(now)
        steps = self._steps.setdefault(info, set())
        if step not in steps:
            steps.add(step)
            log.warning(
                "%s: a run is at step %r, which this code's %s does not have (its steps: %s). "
                "It is handed back untouched, for a worker whose code has the step (during a "
                "rolling deploy, the other release's); or resolve it with "
                "%s.by(...).run(...) or cancel(). This worker now claims only the steps it has.",
                info.name,
                step,
                info.cls.__name__,
                ", ".join(info.named) or "none",
                info.cls.__name__,
            )
        if due_since is not None:
            stranded_at = due_since + self.grace
            if self._check_at is None or stranded_at < self._check_at:
                self._check_at = stranded_at

    def observe(self, now: datetime) -> None:
        """The database's time as just read."""
        self._reading = (now, time.monotonic())

    def seconds_until_check(self) -> float | None:
        """How long until the next check is due (0 when it is); None when nothing is watched."""
        now = self._now()
        if self._check_at is None or now is None:
            return None
        return max(0.0, (self._check_at - now).total_seconds())

    def check_due(self) -> bool:
        """Whether the worker should check now."""
        seconds = self.seconds_until_check()
        return seconds is not None and seconds <= 0

    async def check(self, conn: AsyncConnection) -> list[StrandedRuns]:
        """Count the watched steps' stranded runs: log each, set the gauge, plan the next check."""
        self.checks += 1
        found: list[StrandedRuns] = []
        for info, steps in self._steps.items():
            counted = await stranded_in(conn, info, self.grace, tuple(sorted(steps)))
            runs = {stranded.step: stranded.runs for stranded in counted}
            for step in steps:
                runs_stranded(info.name, step, runs.get(step, 0))
            for stranded in counted:
                log.warning(
                    "%s: %d run(s) have been due at step %r since %s, longer than %s, and no "
                    "worker has taken them: deploy code that has this step, or resolve them "
                    "with %s.by(...).run(...) or cancel().",
                    stranded.workflow,
                    stranded.runs,
                    stranded.step,
                    stranded.since.isoformat(),
                    self.grace,
                    info.cls.__name__,
                )
            found.extend(counted)
        now = self._now()
        self._check_at = None if now is None else now + self.grace
        return found

    def _now(self) -> datetime | None:
        """The database's time, counted on from the last reading by this process's clock."""
        if self._reading is None:
            return None
        read, at = self._reading
        return read + timedelta(seconds=time.monotonic() - at)
