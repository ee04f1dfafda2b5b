"""The fast path for step outcomes that change only the engine's columns.

Most steps that finish together under load (no-op steps, steps that only
choose what comes next) touch no column of their own row. Their outcomes go
in one short UPDATE driven by arrays, whose text never changes with the
number of rows, so PostgreSQL plans it once (psycopg prepares it) and
psycopg converts it once:

    WITH moved AS (
        UPDATE t SET ... FROM unnest(:keys, :versions, ...) AS v(...)
        WHERE t.key = v.key AND t.wf_version = v.version      -- the fence
        RETURNING t.*, v.*),
    logged AS (INSERT INTO attempt_log SELECT ... FROM moved)
    SELECT moved.*, pg_notify(...) for rows that announce FROM moved

Outcomes that change the row's own columns take `commits.fenced_writes`,
which SQLAlchemy types column by column.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    Integer,
    Interval,
    Row,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.clock import db_now
from engine.commits import LOG_COLUMNS, Write
from engine.notify import announcement
from engine.workflow import WorkflowInfo

# Per-row values, in the order of the unnest() columns; the key columns come first.
ROW_FIELDS: list[tuple[str, Any]] = [
    ("version", Integer),
    ("next_step", Text),
    ("next_args", Text),  # JSON text, cast to jsonb in the UPDATE
    ("attempts", Integer),
    ("last_error", Text),
    ("wake_after", Interval),
    ("wake_at", DateTime(timezone=True)),
    ("hold", Interval),
    ("announce", Boolean),
    ("discard", Boolean),
    ("position", Integer),
    ("run_key", Text),
    ("step", Text),
    ("attempt", Integer),
    ("outcome", Text),
    ("error", Text),
    ("took_ms", Float),
]


def takes(write: Write) -> bool:
    """Whether the fast path alone can commit this write: engine-only, touching no other row."""
    return engine_only(write) and not write.needs_transaction


def engine_only(write: Write) -> bool:
    """Whether this outcome fits the fast path: no user columns, no wait, no event key."""
    outcome = write.outcome
    return (
        not outcome.changes
        and write.record is not None
        and outcome.pending != "wait"
        and outcome.recent_event_keys is None
    )


async def bulk_fenced_writes(
    conn: AsyncConnection, writes: Sequence[Write], *, attempt_log: type[Any] | None
) -> list[Row[Any] | None]:
    """Commit engine-only outcomes to rows of one table in one short statement."""
    info = writes[0].claim.info
    columns: dict[str, list[Any]] = {f"key{i}": [] for i in range(len(info.mapper.primary_key))}
    columns.update({name: [] for name, _ in ROW_FIELDS})
    for position, write in enumerate(writes):
        outcome, record = write.outcome, write.record
        assert record is not None
        for i, value in enumerate(write.claim.key):
            columns[f"key{i}"].append(value)
        next_args = None if outcome.next_args is None else json.dumps(outcome.next_args)
        values = (
            write.claim.version, outcome.next_step, next_args, outcome.attempts,
            outcome.last_error, outcome.wake_after, outcome.wake_at, outcome.hold, write.announce,
            outcome.pending == "discard", position,
            record.run_key, record.step, record.attempt, record.outcome, record.error,
            record.took_ms,
        )  # fmt: skip
        for (name, _), value in zip(ROW_FIELDS, values, strict=True):
            columns[name].append(value)
    statement = _bulk_statement(info, attempt_log)  # type: ignore[arg-type]
    written: list[Row[Any] | None] = [None] * len(writes)
    for row in (await conn.execute(statement, columns)).all():
        written[row.v_position] = row
    return written


@lru_cache(maxsize=256)
def _bulk_statement(info: WorkflowInfo, attempt_log: type[Any] | None) -> Executable:
    table = info.table
    keys = list(info.mapper.primary_key)
    arrays = [
        cast(bindparam(f"key{i}", type_=ARRAY(column.type)), ARRAY(column.type))
        for i, column in enumerate(keys)
    ] + [cast(bindparam(name, type_=ARRAY(type_)), ARRAY(type_)) for name, type_ in ROW_FIELDS]
    names = [f"v_key{i}" for i in range(len(keys))] + [f"v_{name}" for name, _ in ROW_FIELDS]
    v = func.unnest(*arrays).table_valued(*names).render_derived(name="v", with_types=False)
    now = db_now()
    moved = (
        update(table)
        # The fence, row by row: each row is ours only at the version we claimed.
        .where(*(column == v.c[f"v_key{i}"] for i, column in enumerate(keys)))
        .where(table.c.wf_version == v.c.v_version)
        .values(
            next_step=v.c.v_next_step,
            next_args=cast(v.c.v_next_args, JSONB),
            attempts=v.c.v_attempts,
            last_error=v.c.v_last_error,
            # Held: leased on, to run the next step here. Otherwise due at wake_at or
            # after wake_after; never when both are NULL.
            claimed_until=now + v.c.v_hold,
            wake_at=func.coalesce(now + v.c.v_hold, v.c.v_wake_at, now + v.c.v_wake_after),
            waiting_for=None,
            # A held event survives a step that goes on, not one that ends the run.
            pending_event=case((v.c.v_discard, None), else_=table.c.pending_event),
            wf_version=v.c.v_version + 1,
        )
        .returning(*table.c, *(v.c[name] for name in names if not name.startswith("v_key")))
        .cte("moved")
    )
    notified = case((moved.c.v_announce, announcement(table.name)), else_=None)
    query = select(moved, notified.label("duly_notified"))
    if attempt_log is not None:
        logged = (
            insert(attempt_log.__table__)
            .from_select(
                LOG_COLUMNS,
                select(
                    literal(table.name),
                    moved.c.v_run_key,
                    moved.c.v_step,
                    moved.c.v_attempt,
                    moved.c.v_outcome,
                    moved.c.v_error,
                    moved.c.v_took_ms,
                    db_now(),
                ),
            )
            .cte("logged")
        )
        query = query.add_cte(logged)
    return query
