"""What an operator reads of the schedules: every run that `every(...)` keeps going.

    schedules = await list_schedules(connection)                 # every workflow
    schedules = await list_schedules(connection, [info])         # one

The HTTP API, the console and `duly schedules` all read through this.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import cast, select
from sqlalchemy.dialects.postgresql import JSONB

from engine.base.clock import db_now
from engine.model.connection import WorkflowConnection
from engine.model.registry import WorkflowInfo
from engine.runs.schedules import SCHEDULE_ENTRY
from engine.views.runs import key_text_of

MAX_SCHEDULES = 500  # scheduled runs a workflow lists at most, by key


@dataclass(frozen=True)
class ScheduledRun:
    """One scheduled run: its schedule as written, when it fires next and last fired."""

    workflow: str
    key: str
    step: str
    kind: str  # cron, interval or function
    expression: str  # a cron's five fields; an interval as hours:minutes:seconds; a name
    timezone: str | None  # a cron's; the others run on the database clock
    next_firing: datetime | None  # None while paused, or while its step runs
    last_firing: datetime | None
    paused: bool
    running: bool

    def to_dict(self) -> dict[str, Any]:
        """The run as JSON-ready values (datetimes as ISO text)."""
        return {
            "workflow": self.workflow,
            "key": self.key,
            "step": self.step,
            "kind": self.kind,
            "expression": self.expression,
            "timezone": self.timezone,
            "next_firing": self.next_firing.isoformat() if self.next_firing else None,
            "last_firing": self.last_firing.isoformat() if self.last_firing else None,
            "paused": self.paused,
            "running": self.running,
        }


async def list_schedules(
    connection: WorkflowConnection, infos: Iterable[WorkflowInfo] | None = None
) -> list[ScheduledRun]:
    """The scheduled runs of `infos` (default: every workflow served), by workflow and key."""
    found: list[ScheduledRun] = []
    chosen = sorted(connection.workflows if infos is None else infos, key=lambda i: i.name)
    async with connection.autocommit.connect() as conn:
        for info in chosen:
            table = info.table
            key_columns = list(info.mapper.primary_key)
            query = (
                select(
                    *key_columns,
                    table.c.next_step,
                    table.c.next_args[SCHEDULE_ENTRY].label("duly_schedule"),
                    table.c.wake_at,
                    table.c.claimed_until,
                    db_now().label("duly_now"),
                )
                # A run finished or failed keeps no next_args: only live schedules match.
                .where(table.c.next_step.is_not(None))
                .where(cast(table.c.next_args, JSONB).op("?")(SCHEDULE_ENTRY))
                .order_by(*key_columns)
                .limit(MAX_SCHEDULES)
            )
            for row in (await conn.execute(query)).all():
                key = key_text_of([row._mapping[column] for column in key_columns])
                found.append(_scheduled_run(info.name, key, row))
    return found


def _scheduled_run(workflow: str, key: str, row: Any) -> ScheduledRun:
    entry: dict[str, Any] = row.duly_schedule or {}
    running = row.claimed_until is not None and row.claimed_until > row.duly_now
    if "cron" in entry:
        kind, expression, zone = "cron", str(entry["cron"]), str(entry.get("zone", "UTC"))
    elif "interval" in entry:
        kind, zone = "interval", None
        expression = str(timedelta(seconds=float(entry["interval"])))
    else:
        kind, expression, zone = "function", str(entry.get("function", "?")), None
    fired = entry.get("fired_at")
    return ScheduledRun(
        workflow=workflow,
        key=key,
        step=row.next_step,
        kind=kind,
        expression=expression,
        timezone=zone,
        next_firing=None if running else row.wake_at,
        last_firing=datetime.fromisoformat(fired) if fired else None,
        paused=bool(entry.get("paused")),
        running=running,
    )
