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

What an outcome means for the columns is `outcomes.outcome_values`, as on
the typed path (`commits.fenced_writes`), which takes everything else.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import Boolean, Integer, Row, bindparam, case, cast, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.attempt_log import log_attempts
from engine.clock import db_now
from engine.notify import announcement
from engine.outcomes import (
    FIELD_TYPES,
    LOG_FIELDS,
    OUTCOME_FIELDS,
    Write,
    log_values,
    outcome_values,
    write_fields,
)
from engine.registry import WorkflowInfo

STATEMENT_CACHE_SIZE = 256  # one statement per table and attempt log
# Per-row values, in the order of the unnest() columns after the key columns.
ROW_FIELDS: list[tuple[str, Any]] = [
    *((name, FIELD_TYPES[name]) for name in (*OUTCOME_FIELDS, *LOG_FIELDS)),
    ("announce", Boolean),
    ("position", Integer),
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
        for i, value in enumerate(write.claim.key):
            columns[f"key{i}"].append(value)
        fields = write_fields(write)
        if fields["next_args"] is not None:
            fields["next_args"] = json.dumps(fields["next_args"])
        fields.update(announce=write.announce, position=position)
        for name, _ in ROW_FIELDS:
            columns[name].append(fields[name])
    statement = bulk_statement(info, attempt_log)  # type: ignore[arg-type]
    written: list[Row[Any] | None] = [None] * len(writes)
    for row in (await conn.execute(statement, columns)).all():
        written[row.v_position] = row
    return written


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def bulk_statement(info: WorkflowInfo, attempt_log: type[Any] | None) -> Executable:
    """The array-driven fenced UPDATE of one table (and its log INSERT), built once."""
    table = info.table
    keys = list(info.mapper.primary_key)
    arrays = [
        cast(bindparam(f"key{i}", type_=ARRAY(column.type)), ARRAY(column.type))
        for i, column in enumerate(keys)
    ] + [cast(bindparam(name, type_=ARRAY(type_)), ARRAY(type_)) for name, type_ in ROW_FIELDS]
    names = [f"v_key{i}" for i in range(len(keys))] + [f"v_{name}" for name, _ in ROW_FIELDS]
    v = func.unnest(*arrays).table_valued(*names).render_derived(name="v", with_types=False)

    def value(name: str) -> Any:
        column = v.c[f"v_{name}"]
        return cast(column, JSONB) if name == "next_args" else column

    moved = (
        update(table)
        # The fence, row by row: each row is ours only at the version we claimed.
        .where(*(column == v.c[f"v_key{i}"] for i, column in enumerate(keys)))
        .where(table.c.wf_version == v.c.v_version)
        .values(outcome_values(table, value, db_now()))
        .returning(*table.c, *(v.c[name] for name in names if not name.startswith("v_key")))
        .cte("moved")
    )
    notified = case((moved.c.v_announce, announcement(table.name)), else_=None)
    query = select(moved, notified.label("duly_notified"))
    if attempt_log is not None:
        records = log_values(lambda name: moved.c[f"v_{name}"])
        query = query.add_cte(log_attempts(attempt_log, table.name, records, moved).cte("logged"))
    return query
