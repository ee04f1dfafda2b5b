"""Fenced writes: every change to a claimed row commits only if the row has not moved.

A step's outcome is written as one data-modifying CTE per row,

    WITH moved_0 AS (UPDATE t SET ... WHERE key = :k AND wf_version = :claimed RETURNING t.*),
         logged_0 AS (INSERT INTO attempt_log SELECT ... FROM moved_0),
         moved_1 AS (...), ...
    SELECT 0, moved_0.*, pg_notify(...) FROM moved_0 UNION ALL SELECT 1, moved_1.* ...

so a row's new state, its attempt record and the news that work is ready
commit together or not at all, several steps' outcomes share one round trip
and one WAL flush, and a missing row in the result is the typed outcome
"fenced": another worker took the row over, or `run()` preempted it.

Building SQLAlchemy constructs costs more than executing them, so each shape
of statement (table, and per row: which user columns changed, logged or not,
announced or not) is built once and kept, and every write is only parameters.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Float,
    Integer,
    Interval,
    Row,
    Text,
    and_,
    bindparam,
    case,
    cast,
    false,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.clock import db_now
from engine.notify import announcement
from engine.rows import key_arguments, key_clause, key_parameters
from engine.workflow import WorkflowInfo

STATEMENT_CACHE_SIZE = 512  # distinct statement shapes kept built

LOG_COLUMNS = [
    "workflow",
    "run_key",
    "step",
    "attempt",
    "outcome",
    "error",
    "took_ms",
    "finished_at",
]


@dataclass
class Claim:
    """A row this worker holds: which table, which key, and the version it may commit against.

    `lease_end` is the `claimed_until` this worker last wrote: it identifies
    the lease even after `run()` or `cancel()` moved the version on.
    """

    info: WorkflowInfo
    key: tuple[Any, ...]
    version: int
    lease_end: datetime | None = None
    scheduled_at: datetime | None = None  # the row's wake_at before this claim took it
    claimed_at: datetime | None = None  # the database clock when it was claimed
    claimed_clock: float = field(default_factory=time.monotonic)  # this process's, then

    def database_now(self) -> datetime | None:
        """The database clock now, from the claim's reading and the time since."""
        if self.claimed_at is None:
            return None
        return self.claimed_at + timedelta(seconds=time.monotonic() - self.claimed_clock)


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt, as the attempt log stores it."""

    run_key: str
    step: str
    attempt: int
    outcome: str
    error: str | None
    took_ms: float


@dataclass(frozen=True)
class Outcome:
    """The engine columns a step attempt leaves on its row, and the row's own changes.

    `wake_after` schedules `next_step` that long from now, `wake_at` at an
    instant of the database clock (a schedule's next occurrence, which must
    not drift by however long the commit took); with neither, nothing is
    scheduled. `hold` instead keeps the lease that long, for a worker that
    runs the next step itself.
    """

    next_step: str | None
    next_args: dict[str, Any] | None
    attempts: int = 0
    last_error: str | None = None
    wake_after: timedelta | None = None
    wake_at: datetime | None = None
    hold: timedelta | None = None
    changes: dict[str, Any] = field(default_factory=dict)  # column name -> value
    # Waiting for an event: the step it waits on (next_step is then the timeout step).
    waiting_for: str | None = None
    # What becomes of a held event: "keep" it for a later wait, "discard" it (the run
    # stops, waits for something else, or goes round its schedule), or "wait": apply it
    # now if it is for `waiting_for`, else discard it.
    pending: str = "keep"
    recent_event_keys: list[str] | None = None  # set when this attempt took an event key


@dataclass(frozen=True)
class Write:
    """One step outcome to commit against a claim, with what goes in the same commit."""

    claim: Claim
    outcome: Outcome
    record: AttemptRecord | None = None  # the attempt to log, when a log is mapped
    announce: bool = False  # NOTIFY: this write leaves work ready for any worker
    fan_out: Any = None  # a FanOut whose children start in this same commit
    finishes_child_of: dict[str, Any] | None = None  # the parent this run was the child of

    @property
    def needs_transaction(self) -> bool:
        """Whether this write touches other rows too (children, a parent) in its commit."""
        return self.fan_out is not None or self.finishes_child_of is not None


async def fenced_writes(
    conn: AsyncConnection, writes: Sequence[Write], *, attempt_log: type[Any] | None = None
) -> list[Row[Any] | None]:
    """Commit step outcomes to rows of one table in a single statement.

    Returns, in order, each row as written, or None where the fence held.
    """
    info = writes[0].claim.info
    if any(write.claim.info is not info for write in writes):
        raise ValueError("fenced_writes() takes writes to one table at a time.")
    logged = attempt_log is not None
    shape = tuple(
        (
            tuple(sorted(w.outcome.changes)),
            logged and w.record is not None,
            w.announce,
            w.outcome.pending,
            w.outcome.recent_event_keys is not None,
        )
        for w in writes
    )
    statement = _outcome_statement(info, attempt_log, shape)  # type: ignore[arg-type]
    params: dict[str, Any] = {}
    for index, write in enumerate(writes):
        params.update(_outcome_params(index, info, write))
    written: list[Row[Any] | None] = [None] * len(writes)
    for row in (await conn.execute(statement, params)).all():
        written[row.duly_write] = row
    return written


def _outcome_params(index: int, info: WorkflowInfo, write: Write) -> dict[str, Any]:
    outcome, claim = write.outcome, write.claim
    params: dict[str, Any] = {
        f"w{index}_version": claim.version,
        f"w{index}_next_step": outcome.next_step,
        f"w{index}_next_args": outcome.next_args,
        f"w{index}_attempts": outcome.attempts,
        f"w{index}_last_error": outcome.last_error,
        f"w{index}_wake_after": outcome.wake_after,
        f"w{index}_wake_at": outcome.wake_at,
        f"w{index}_hold": outcome.hold,
        f"w{index}_waiting_for": outcome.waiting_for,
        f"w{index}_recent_event_keys": outcome.recent_event_keys,
    }
    params.update(key_arguments(claim.key, prefix=f"w{index}_key"))
    for name, value in outcome.changes.items():
        params[f"w{index}_set_{name}"] = value
    record = write.record
    if record is not None:
        params.update(
            {
                f"w{index}_log_run_key": record.run_key,
                f"w{index}_log_step": record.step,
                f"w{index}_log_attempt": record.attempt,
                f"w{index}_log_outcome": record.outcome,
                f"w{index}_log_error": record.error,
                f"w{index}_log_took_ms": record.took_ms,
            }
        )
    return params


Shape = tuple[tuple[tuple[str, ...], bool, bool, str, bool], ...]


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def _outcome_statement(
    info: WorkflowInfo, attempt_log: type[Any] | None, shape: Shape
) -> Executable:
    table = info.table
    branches = []
    for index, (changed, logged, announce, pending, takes_key) in enumerate(shape):

        def param(name: str, type_: Any = None, i: int = index, typed: bool = True) -> Any:
            value = bindparam(f"w{i}_{name}", type_=type_)
            # A cast gives a NULL parameter its type on the server; values assigned to
            # the user's own columns are not cast, since a cast to varchar(n) truncates.
            return cast(value, type_) if typed else value

        claimed = param("version", Integer)
        hold = param("hold", Interval)
        key = key_parameters(info, prefix=f"w{index}_key")
        now = db_now()
        waiting = param("waiting_for", table.c.waiting_for.type, typed=False)
        # A wait that finds its event already held takes it at once.
        applied = (
            and_(table.c.pending_event["step"].as_string() == cast(waiting, Text))
            if pending == "wait"
            else false()
        )
        values: dict[Any, Any] = {
            table.c.next_step: case(
                (applied, waiting),
                else_=param("next_step", table.c.next_step.type, typed=False),
            ),
            table.c.next_args: case(
                (applied, table.c.pending_event.op("-")("step")),
                else_=param("next_args", table.c.next_args.type),
            ),
            table.c.attempts: param("attempts", Integer),
            table.c.last_error: param("last_error", Text),
            # A held row stays leased (and due again when the lease ends); otherwise it
            # is due at wake_at or after wake_after, never when both are NULL.
            table.c.claimed_until: now + hold,
            table.c.wake_at: case(
                (applied, now),
                else_=func.coalesce(
                    now + hold,
                    param("wake_at", DateTime(timezone=True)),
                    now + param("wake_after", Interval),
                ),
            ),
            table.c.waiting_for: case((applied, None), else_=waiting),
            table.c.wf_version: claimed + 1,
        }
        if pending != "keep":
            values[table.c.pending_event] = None
        if takes_key:
            values[table.c.recent_event_keys] = param(
                "recent_event_keys", table.c.recent_event_keys.type
            )
        for name in changed:
            values[table.c[name]] = param(f"set_{name}", table.c[name].type, typed=False)
        moved = (
            update(table)
            # The fence: the row is ours only while its version is the one we claimed.
            .where(key_clause(info, key), table.c.wf_version == claimed)
            .values(values)
            .returning(*table.c)
            .cte(f"moved_{index}")
        )
        ready_now: ColumnElement[bool] = literal(announce)
        if pending == "wait":
            ready_now = or_(ready_now, moved.c.waiting_for.is_(None))
        notified = case((ready_now, announcement(table.name)), else_=null().cast(Text))
        branch = select(
            literal(index).label("duly_write"), *moved.c, notified.label("duly_notified")
        )
        if logged and attempt_log is not None:
            branch = branch.add_cte(_log_attempt(attempt_log, table.name, moved, param))
        branches.append(branch)
    return branches[0] if len(branches) == 1 else union_all(*branches)


def _log_attempt(attempt_log: type[Any], workflow: str, moved: Any, param: Any) -> Any:
    """An INSERT of the attempt's log row, made only if its fenced UPDATE wrote the row."""
    return (
        insert(attempt_log.__table__)
        .from_select(
            LOG_COLUMNS,
            select(
                literal(workflow),
                param("log_run_key", Text),
                param("log_step", Text),
                param("log_attempt", Integer),
                param("log_outcome", Text),
                param("log_error", Text),
                param("log_took_ms", Float),
                db_now(),
            ).select_from(moved),
        )
        .cte(f"logged_{moved.name}")
    )


# -- lease bookkeeping: rare, single-row, built as needed ---------------------------


async def hand_back(conn: AsyncConnection, claim: Claim) -> bool:
    """Release a lease so any worker may take the row at once, and say so."""
    table = claim.info.table
    moved = (
        update(table)
        .where(key_clause(claim.info, claim.key), table.c.wf_version == claim.version)
        .values(claimed_until=None, wake_at=db_now(), wf_version=claim.version + 1)
        .returning(table.c.wf_version)
        .cte("moved")
    )
    announced = select(announcement(table.name)).select_from(moved)
    return (await conn.execute(announced)).first() is not None


async def renew(conn: AsyncConnection, claim: Claim, lease: timedelta) -> bool:
    """Extend a lease, keeping the version; False when the row moved on without us."""
    table = claim.info.table
    lease_end = db_now() + literal(lease)
    statement = (
        update(table)
        .where(key_clause(claim.info, claim.key), table.c.wf_version == claim.version)
        .values(claimed_until=lease_end, wake_at=lease_end)
        .returning(table.c.claimed_until)
    )
    renewed = (await conn.execute(statement)).first()
    if renewed is None:
        return False
    claim.lease_end = renewed.claimed_until
    return True


async def release_preempted(conn: AsyncConnection, claim: Claim) -> bool:
    """After a fenced commit, give up the lease `run()` left in place, so its step starts now.

    `run()` moves the version on but leaves a running step its lease; the
    lease is still ours if `claimed_until` is the value we last wrote. A row
    another worker took over, or that `cancel()` ended, is left alone.
    """
    if claim.lease_end is None:
        return False
    table = claim.info.table
    moved = (
        update(table)
        .where(
            key_clause(claim.info, claim.key),
            table.c.claimed_until == claim.lease_end,
            table.c.next_step.isnot(None),
        )
        .values(claimed_until=None, wake_at=db_now())
        .returning(table.c.wf_version)
        .cte("moved")
    )
    announced = select(announcement(table.name)).select_from(moved)
    return (await conn.execute(announced)).first() is not None
