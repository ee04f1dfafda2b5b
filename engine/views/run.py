"""One run in full, as an operator reads it: its engine columns, attempts and children.

    detail = await run_detail(connection, info, parse_key(info, "42"), attempts=200)

The HTTP API, the console and `duly show` read a run through this, and say in the
same words why a history shows no attempt (`no_attempts_text`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import DataError
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.base.clock import db_now
from engine.base.errors import DulyError, NotFoundError, first_line
from engine.events.records import OutboxColumns
from engine.model.connection import WorkflowConnection
from engine.model.registry import ENGINE_COLUMNS, WorkflowInfo
from engine.runs.fanout import children_of
from engine.runs.history import history_statement
from engine.views.overview import run_state
from engine.views.runs import (
    LOG_RUN_COLUMNS,
    MAX_CHILDREN,
    RunKey,
    RunSummary,
    key_text_of,
    rows_of,
    summarize,
)

FAILED_OUTCOMES = frozenset({"retry", "failed"})  # attempts that keep a traceback
SETTLED_STATES = frozenset({"finished", "failed"})  # a run in them has had attempts


@dataclass(frozen=True)
class ChildRun:
    """A run this run fanned out."""

    workflow: str
    key: str
    state: str


@dataclass(frozen=True)
class RunDetail:
    """One run in full: its summary, every engine column, its attempts and its children."""

    summary: RunSummary
    engine: dict[str, Any]  # every engine column, by name
    history: list[dict[str, Any]] | None  # attempts oldest first; None without an attempt log
    earlier: bool  # older attempts were left out (see `attempts=`)
    children: list[ChildRun] | None  # None when the run never fanned out
    now: datetime  # the database's time (the moved clock included), to read the times by
    logged: bool = True  # whether its workflow logs its attempts (`__workflow_attempt_log__`)

    def to_dict(self) -> dict[str, Any]:
        """The run as `GET /workflows/{name}/runs/{key}` answers it (values still Python's)."""
        return {**self.summary.to_dict(), "history": self.history}

    def failed_attempts(self) -> list[dict[str, Any]]:
        """The attempts shown that failed (retried or given up), oldest first."""
        return [a for a in self.history or [] if a["outcome"] in FAILED_OUTCOMES]

    def no_attempts_text(self) -> str:
        """Why the history shows no attempt, by the run's state: none yet, its workflow keeps
        none, or they were pruned (`duly prune` deletes attempts past their retention)."""
        state = self.summary.state
        if not self.logged:
            return "No attempt kept: this workflow logs none (__workflow_attempt_log__ = False)."
        if state in SETTLED_STATES or self.engine.get("attempts"):
            return f"No attempt kept: this run is {state} and its history was pruned."
        if state == "cancelled":
            return "No attempt kept: cancelled before any step ran, or its history was pruned."
        return "No attempt yet."


async def read_run(connection: WorkflowConnection, info: WorkflowInfo, key: RunKey) -> Any:
    """The run with the key `key`; NotFoundError when there is none."""
    too_deep = False
    async with connection.sessionmaker() as session:
        try:
            row = await session.get(info.cls, key.values)
        except DataError as exc:  # a well-typed key the column still refuses: out of range
            reason = first_line(exc.orig, "refused by the database")
            raise DulyError(f"{key.text!r} is not a valid key for {info.name}: {reason}.") from None
        except RecursionError:  # a JSON value stored deeper than json.loads can decode
            too_deep = True
    if too_deep:
        row = await read_run_shown(connection, info, key)
    if row is None:
        raise NotFoundError(f"No {info.name} run has the key {key.text!r}.")
    return row


async def read_run_shown(connection: WorkflowConnection, info: WorkflowInfo, key: RunKey) -> Any:
    """The run's row read for showing only, its JSON read as text (`shown_row`)."""
    statement = select(info.cls).where(*key.where(info))
    async with connection.sessionmaker() as session:
        found = await rows_of(session, info, statement, as_text=True)
    return found[0] if found else None


async def run_history(
    connection: WorkflowConnection, info: WorkflowInfo, row: Any, *, limit: int | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """The run's attempts, oldest first (the newest `limit` when given), and whether older
    ones were left out; NotFoundError when no AttemptLog is mapped."""
    log = connection.attempt_log
    if log is None:
        raise NotFoundError("No AttemptLog is mapped, so duly keeps no history of runs.")
    statement = history_statement(log, info.name, row)
    if limit is not None:
        statement = statement.order_by(None).order_by(log.id.desc()).limit(limit + 1)
    async with connection.sessionmaker() as session:
        attempts = list((await session.scalars(statement)).all())
    earlier = limit is not None and len(attempts) > limit
    if limit is not None:
        attempts = attempts[:limit][::-1]
    shown = [c.key for c in log.__table__.c if c.key not in LOG_RUN_COLUMNS]
    return [{name: getattr(a, name) for name in shown} for a in attempts], earlier


async def run_children(
    connection: WorkflowConnection, info: WorkflowInfo, row: Any
) -> list[ChildRun] | None:
    """The runs this run fanned out (the newest MAX_CHILDREN a table); None if it never did.

    Only a run that fanned out has `children_left` set, so no other run's
    page looks; a child names its parent in its `parent` column, which has
    no index, so each table is read newest first until enough are found.
    """
    if row.children_left is None:
        return None
    key = tuple(info.mapper.primary_key_from_instance(row))
    found: list[ChildRun] = []
    state_columns = ("claimed_until", "waiting_for", "next_step", "attempts", "last_error")
    async with connection.autocommit.connect() as conn:
        for child in connection.workflows:
            if issubclass(child.cls, OutboxColumns):
                continue
            keys = list(child.mapper.primary_key)
            # Keys and engine columns only: what names the child and says its state.
            statement = (
                select(*keys, *(child.table.c[name] for name in state_columns))
                .where(children_of(info, key, child.cls))
                .order_by(*(c.desc() for c in keys))
                .limit(MAX_CHILDREN)
            )
            for run in (await conn.execute(statement)).all():
                values = tuple(run)[: len(keys)]
                found.append(ChildRun(child.name, key_text_of(values), run_state(run)))
    return found


async def run_detail(
    connection: WorkflowConnection, info: WorkflowInfo, key: RunKey, *, attempts: int | None = None
) -> RunDetail:
    """The run `key` in full; its newest `attempts` attempts (all when None)."""
    row = await read_run(connection, info, key)
    history: list[dict[str, Any]] | None = None
    earlier = False
    if connection.attempt_log is not None:
        history, earlier = await run_history(connection, info, row, limit=attempts)
    async with connection.autocommit.connect() as conn:
        now = await database_now(conn)
    return RunDetail(
        summary=summarize(info, row),
        engine={name: getattr(row, name) for name in ENGINE_COLUMNS},
        history=history,
        earlier=earlier,
        children=await run_children(connection, info, row),
        now=now,
        logged=info.logged,
    )


async def database_now(conn: AsyncConnection) -> datetime:
    """The database's time, the moved clock included."""
    now: datetime = (await conn.execute(select(db_now()))).scalar_one()  # type: ignore[assignment]
    return now
