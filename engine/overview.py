"""What an operator sees first: each workflow table's runs by state, and when the next is due.

The states are read from the engine's columns alone, so any table's rows
have one, and the HTTP API, the console and `duly status` ask the same
queries:

- running: leased (a worker holds it now);
- waiting: parked until an event is delivered;
- scheduled: a step is due at `wake_at` (now or later), never tried yet;
- retrying: a step is due again after a failed attempt;
- finished, failed (gave up: an error and nothing next), cancelled.

Two more counts cut across them: *due* (scheduled or retrying, and due
now) and *stranded* (leased, but the lease has ended: its worker died, and
the next claim takes it over). Counting reads whole tables, so it runs only
when someone asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, select

from engine.clock import db_now
from engine.connection import WorkflowConnection
from engine.events.records import EventTables
from engine.events.views import OutboxSummary, outbox_summary
from engine.handles import CANCELLED
from engine.registry import WorkflowInfo

RUN_STATES = ("running", "waiting", "scheduled", "retrying", "finished", "failed", "cancelled")


def state_condition(table: Any, state: str) -> ColumnElement[bool]:
    """The rows of `table` in `state` (one of RUN_STATES), by the engine's columns."""
    c = table.c
    at_rest = c.claimed_until.is_(None)
    ended = and_(at_rest, c.next_step.is_(None), c.waiting_for.is_(None))
    conditions: dict[str, ColumnElement[bool]] = {
        "running": c.claimed_until.is_not(None),
        "waiting": and_(at_rest, c.waiting_for.is_not(None)),
        "scheduled": and_(
            at_rest, c.waiting_for.is_(None), c.next_step.is_not(None), c.attempts == 0
        ),
        "retrying": and_(
            at_rest, c.waiting_for.is_(None), c.next_step.is_not(None), c.attempts > 0
        ),
        "finished": and_(ended, c.last_error.is_(None)),
        "failed": and_(ended, c.last_error.is_not(None), c.last_error != CANCELLED),
        "cancelled": and_(ended, c.last_error == CANCELLED),
    }
    return conditions[state]


def run_state(row: Any) -> str:
    """The state of one run (a row or an instance), as `state_condition` counts it."""
    if row.claimed_until is not None:
        return "running"
    if row.waiting_for is not None:
        return "waiting"
    if row.next_step is not None:
        return "retrying" if row.attempts else "scheduled"
    if row.last_error == CANCELLED:
        return "cancelled"
    return "failed" if row.last_error is not None else "finished"


@dataclass(frozen=True)
class WorkflowCounts:
    """One workflow table's runs by state, with the cross-cutting counts and the next instant."""

    workflow: str
    total: int
    states: Mapping[str, int] = field(default_factory=dict)
    due: int = 0  # scheduled or retrying, due now
    stranded: int = 0  # leased past the lease's end
    next_due: datetime | None = None  # the earliest `wake_at` of a step not yet running

    def to_dict(self) -> dict[str, Any]:
        """The counts as JSON values."""
        return {
            "workflow": self.workflow,
            "total": self.total,
            "states": dict(self.states),
            "due": self.due,
            "stranded": self.stranded,
            "next_due": self.next_due.isoformat() if self.next_due else None,
        }


@lru_cache(maxsize=256)
def overview_statement(info: WorkflowInfo) -> Select[Any]:
    """One row for one table: the count of each state, due, stranded and the next due instant."""
    table = info.table
    c = table.c
    now = db_now()
    waiting_step = and_(c.claimed_until.is_(None), c.next_step.is_not(None))
    columns: list[Any] = [
        func.count().label("total"),
        *(func.count().filter(state_condition(table, s)).label(s) for s in RUN_STATES),
        func.count().filter(waiting_step, c.waiting_for.is_(None), c.wake_at <= now).label("due"),
        func.count().filter(c.claimed_until < now).label("stranded"),
        func.min(c.wake_at).filter(waiting_step, c.waiting_for.is_(None)).label("next_due"),
    ]
    return select(*columns).select_from(table)


async def workflow_overview(connection: WorkflowConnection) -> list[WorkflowCounts]:
    """Every workflow table the connection serves, counted (one statement a table)."""
    found = []
    async with connection.engine.begin() as conn:
        for info in connection.workflows:
            row = (await conn.execute(overview_statement(info))).one()._mapping
            found.append(
                WorkflowCounts(
                    workflow=info.name,
                    total=row["total"],
                    states={state: row[state] for state in RUN_STATES},
                    due=row["due"],
                    stranded=row["stranded"],
                    next_due=row["next_due"],
                )
            )
    return found


@dataclass(frozen=True)
class Overview:
    """What `GET /overview` and `duly status` show: the workflow tables and the outbox."""

    workflows: list[WorkflowCounts]
    outbox: OutboxSummary | None  # None in an app without an outbox

    def to_dict(self) -> dict[str, Any]:
        """The overview as JSON values (times in ISO 8601), the same for the API and the CLI."""
        outbox = None
        if self.outbox is not None:
            outbox = {
                key: value.isoformat() if isinstance(value, datetime) else value
                for key, value in asdict(self.outbox).items()
            }
        return {"workflows": [counts.to_dict() for counts in self.workflows], "outbox": outbox}


async def overview(connection: WorkflowConnection, outbox: EventTables | None) -> Overview:
    """Every workflow table counted, and the outbox's summary when the app maps one."""
    summary = None
    if outbox is not None:
        summary = await outbox_summary(outbox, engine=connection.engine)
    return Overview(await workflow_overview(connection), summary)
