"""What an operator sees first: each workflow table's runs by state, and when the next is due.

The HTTP API, the console and `duly status` ask these same queries. They read the engine's
columns only, and never a whole table: the live states (running, scheduled, retrying, due,
stranded, the next due instant) exactly, through the due index; the resting ones (waiting,
finished, failed, cancelled) among the newest `RECENT_RUNS` rows (`WorkflowCounts.window`
says when that is not the whole table); the outbox's open rows through its status index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import ColumnElement, Interval, Select, and_, func, literal, select

from engine.base.clock import db_now
from engine.claims.stranded import STRANDED_AFTER, StrandedRuns, stranded_after, stranded_runs
from engine.events.records import EventTables
from engine.events.views import OutboxSummary, outbox_summary
from engine.model.connection import WorkflowConnection
from engine.model.due import scheduled
from engine.model.registry import WorkflowInfo
from engine.runs.handles import CANCELLED

RUN_STATES = ("running", "waiting", "scheduled", "retrying", "finished", "failed", "cancelled")
# Counted exactly, through the due index; the others among the newest RECENT_RUNS rows.
LIVE_STATES = ("running", "scheduled", "retrying")
RESTING_STATES = ("waiting", "finished", "failed", "cancelled")
RECENT_RUNS = 10_000  # rows of a table, newest first, its resting states are counted among


def state_condition(table: Any, state: str) -> ColumnElement[bool]:
    """The rows of `table` in `state` (one of RUN_STATES), by the engine's columns.

    running: leased; waiting: parked until an event is delivered; scheduled: a
    step due at `wake_at` (now or later), never tried yet; retrying: a step due
    again after a failed attempt; finished; failed (gave up: an error and nothing
    next); cancelled.
    """
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
    total: int | None  # None when the table holds more rows than the window
    states: Mapping[str, int] = field(default_factory=dict)
    due: int = 0  # scheduled or retrying, due now
    stranded: int = 0  # due for longer than the grace period: no worker has taken it
    next_due: datetime | None = None  # the earliest `wake_at` of a step not yet running
    # The newest rows the resting states were counted among; None when that is every row.
    window: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The counts as JSON values."""
        return {
            "workflow": self.workflow,
            "total": self.total,
            "states": dict(self.states),
            "due": self.due,
            "stranded": self.stranded,
            "next_due": self.next_due.isoformat() if self.next_due else None,
            "window": self.window,
        }


@lru_cache(maxsize=256)
def overview_statement(info: WorkflowInfo, grace: timedelta = STRANDED_AFTER) -> Select[Any]:
    """One row for one table: its live states, due, stranded and the next due instant.

    Only rows with a step scheduled are read (the due index's own condition):
    a running row holds a step, so does a scheduled or retrying one.
    """
    table = info.table
    c = table.c
    now = db_now()
    at_rest = and_(c.claimed_until.is_(None), c.waiting_for.is_(None))
    columns: list[Any] = [
        *(func.count().filter(state_condition(table, s)).label(s) for s in LIVE_STATES),
        func.count().filter(at_rest, c.wake_at <= now).label("due"),
        func.count().filter(c.wake_at < now - literal(grace, Interval)).label("stranded"),
        func.min(c.wake_at).filter(at_rest).label("next_due"),
    ]
    return select(*columns).select_from(table).where(scheduled(c.next_step))


@lru_cache(maxsize=256)
def recent_statement(info: WorkflowInfo) -> Select[Any]:
    """One row for one table: its resting states among its newest RECENT_RUNS rows, and how
    many rows those were (fewer than RECENT_RUNS: the whole table)."""
    table = info.table
    keys = [column.desc() for column in info.mapper.primary_key]
    engine_columns = ("claimed_until", "next_step", "waiting_for", "last_error", "attempts")
    recent = (
        select(*(table.c[name] for name in engine_columns))
        .order_by(*keys)
        .limit(RECENT_RUNS)
        .subquery("recent")
    )
    columns: list[Any] = [
        func.count().label("rows"),
        *(func.count().filter(state_condition(recent, s)).label(s) for s in RESTING_STATES),
    ]
    return select(*columns).select_from(recent)


async def workflow_overview(
    connection: WorkflowConnection, grace: timedelta | None = None
) -> list[WorkflowCounts]:
    """Every workflow table the connection serves, counted (two statements a table).

    `grace` is how long a run is due before it counts as stranded (the setting's).
    """
    period = stranded_after() if grace is None else grace
    found = []
    async with connection.engine.begin() as conn:
        for info in connection.workflows:
            live = (await conn.execute(overview_statement(info, period))).one()._mapping
            recent = (await conn.execute(recent_statement(info))).one()._mapping
            complete = recent["rows"] < RECENT_RUNS
            states = {
                state: (live[state] if state in LIVE_STATES else recent[state])
                for state in RUN_STATES
            }
            found.append(
                WorkflowCounts(
                    workflow=info.name,
                    total=recent["rows"] if complete else None,
                    states=states,
                    due=live["due"],
                    stranded=live["stranded"],
                    next_due=live["next_due"],
                    window=None if complete else RECENT_RUNS,
                )
            )
    return found


async def open_outbox(connection: WorkflowConnection, tables: EventTables) -> OutboxSummary:
    """The outbox's open rows by status, its next due instant, and the failing handlers."""
    return await outbox_summary(tables, engine=connection.autocommit, open_only=True)


@dataclass(frozen=True)
class Overview:
    """What `GET /overview` and `duly status` show: the workflow tables and the outbox."""

    workflows: list[WorkflowCounts]
    outbox: OutboxSummary | None  # None in an app without an outbox
    stranded: list[StrandedRuns] = field(default_factory=list)  # by workflow and step

    def to_dict(self) -> dict[str, Any]:
        """The overview as JSON values (times in ISO 8601), the same for the API and the CLI."""
        outbox = None
        if self.outbox is not None:
            outbox = {
                key: value.isoformat() if isinstance(value, datetime) else value
                for key, value in asdict(self.outbox).items()
            }
        return {
            "workflows": [counts.to_dict() for counts in self.workflows],
            "outbox": outbox,
            "stranded": [runs.to_dict() for runs in self.stranded],
        }


async def overview(connection: WorkflowConnection, outbox: EventTables | None) -> Overview:
    """Every workflow table counted, and the outbox's open rows when the app maps one."""
    summary = None
    if outbox is not None:
        summary = await open_outbox(connection, outbox)
    grace = stranded_after()
    workflows = await workflow_overview(connection, grace)
    # Which steps they are at: only asked when there are some.
    stranded = await stranded_runs(connection, grace) if any(w.stranded for w in workflows) else []
    return Overview(workflows, summary, stranded)
