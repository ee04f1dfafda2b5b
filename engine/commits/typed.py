"""Fenced writes, the typed path: a claimed row's change commits only if the row has not moved.

Each row's outcome is a data-modifying CTE (`UPDATE ... WHERE key = :k AND wf_version =
:claimed RETURNING`) with its attempt-log INSERT and its NOTIFYs (work ready, a run ended);
several rows share one statement (`UNION ALL`), and a row missing from the result is the
typed outcome "fenced". This path takes outcomes that change the row's own columns (typed
by SQLAlchemy) or arm a wait; the rest take `fast`. Each shape of statement is built once and kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Row,
    Text,
    bindparam,
    case,
    cast,
    literal,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.base.clock import db_now, written_as_database_time
from engine.base.errors import InvalidArgumentError
from engine.base.notify import announcement
from engine.commits.outcomes import FIELD_TYPES, Write, log_values, outcome_values, write_fields
from engine.model.attempt_log import log_attempts
from engine.model.registry import WorkflowInfo
from engine.model.rows import key_arguments, key_clause, key_parameters
from engine.runs.waiting import ended, ended_announcement

STATEMENT_CACHE_SIZE = 512  # distinct statement shapes kept built

# (changed user columns, logged, announced, what becomes of a held event, takes a key,
# logs a failure's traceback and arguments)
RowShape = tuple[tuple[str, ...], bool, bool, str, bool, bool]


async def fenced_writes(
    conn: AsyncConnection, writes: Sequence[Write], *, attempt_log: type[Any] | None = None
) -> list[Row[Any] | None]:
    """Commit step outcomes to rows of one table in a single statement.

    Returns, in order, each row as written, or None where the fence held.
    """
    info = writes[0].claim.info
    if any(write.claim.info is not info for write in writes):
        raise InvalidArgumentError("fenced_writes() takes writes to one table at a time.")
    logged = attempt_log is not None
    shape = tuple(
        (
            tuple(sorted(w.outcome.changes)),
            logged and w.record is not None,
            w.announce,
            w.outcome.pending,
            w.outcome.recent_event_keys is not None,
            logged and w.record is not None and w.record.failure,
        )
        for w in writes
    )
    statement = outcome_statement(info, attempt_log, shape)  # type: ignore[arg-type]
    params: dict[str, Any] = {}
    for index, write in enumerate(writes):
        params.update(_parameters(index, info, write))
    written: list[Row[Any] | None] = [None] * len(writes)
    for row in (await conn.execute(statement, params)).all():
        written[row.duly_write] = row
    return written


def _parameters(index: int, info: WorkflowInfo, write: Write) -> dict[str, Any]:
    """The write's values under the names of the `index`-th row of the statement."""
    params = {f"w{index}_{name}": value for name, value in write_fields(write).items()}
    if write.outcome.recent_event_keys is not None:
        params[f"w{index}_recent_event_keys"] = write.outcome.recent_event_keys
    params.update(key_arguments(write.claim.key, prefix=f"w{index}_key"))
    for name, value in write.outcome.changes.items():
        params[f"w{index}_set_{name}"] = value
    return params


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def outcome_statement(
    info: WorkflowInfo, attempt_log: type[Any] | None, shape: tuple[RowShape, ...]
) -> Executable:
    """The statement that commits one outcome per entry of `shape`, built once per shape."""
    branches = [
        _row_branch(info, attempt_log, index, row_shape) for index, row_shape in enumerate(shape)
    ]
    return branches[0] if len(branches) == 1 else union_all(*branches)


def _row_branch(
    info: WorkflowInfo, attempt_log: type[Any] | None, index: int, row_shape: RowShape
) -> Any:
    """One row's fenced UPDATE (and log INSERT) as CTEs, and the SELECT of what it wrote."""
    changed, logged, announce, pending, takes_key, failure = row_shape
    table = info.table
    types = {
        **FIELD_TYPES,
        # Not cast: a cast to varchar(n) truncates where an assignment refuses.
        "next_step": None,
        "waiting_for": None,
        "next_args": table.c.next_args.type,
        "recent_event_keys": table.c.recent_event_keys.type,
    }

    def value(name: str) -> Any:
        parameter = bindparam(f"w{index}_{name}", type_=types[name])
        # A cast gives a NULL parameter its type on the server.
        return parameter if types[name] is None else cast(parameter, types[name])

    now = db_now()
    values = outcome_values(table, value, now)
    if pending == "wait":
        # A wait that finds its event already held takes it at once.
        waiting = value("waiting_for")
        applied = table.c.pending_event["step"].as_string() == cast(waiting, Text)
        values[table.c.next_step] = case((applied, waiting), else_=values[table.c.next_step])
        values[table.c.next_args] = case(
            (applied, table.c.pending_event.op("-")("step")), else_=values[table.c.next_args]
        )
        values[table.c.wake_at] = case((applied, now), else_=values[table.c.wake_at])
        values[table.c.waiting_for] = case((applied, None), else_=waiting)
    if takes_key:
        values[table.c.recent_event_keys] = value("recent_event_keys")
    for name in changed:
        column = table.c[name]
        # The row's own columns, typed by their column and never cast; a time the database
        # keeps is the commit's own.
        if written_as_database_time(column):
            values[column] = now
        else:
            values[column] = bindparam(f"w{index}_set_{name}", type_=column.type)
    key = key_parameters(info, prefix=f"w{index}_key")
    moved = (
        update(table)
        # The fence: the row is ours only while its version is the one we claimed.
        .where(key_clause(info, key), table.c.wf_version == value("version"))
        .values(values)
        .returning(*table.c)
        .cte(f"moved_{index}")
    )
    ready_now: ColumnElement[bool] = literal(announce)
    if pending == "wait":
        ready_now = or_(ready_now, moved.c.waiting_for.is_(None))
    notified = case((ready_now, announcement(table.name)), else_=null().cast(Text))
    # A run this write ends is announced to its waiters (`engine.runs.waiting`).
    told_ended = case((ended(moved), ended_announcement(table.name)), else_=null().cast(Text))
    branch = select(
        literal(index).label("duly_write"),
        *moved.c,
        notified.label("duly_notified"),
        told_ended.label("duly_ended"),
    )
    if logged and attempt_log is not None:
        logging = log_attempts(attempt_log, table.name, log_values(value, failure), moved)
        branch = branch.add_cte(logging.cte(f"logged_{moved.name}"))
    return branch
