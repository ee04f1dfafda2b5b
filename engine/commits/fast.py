"""The fast path for step outcomes: one short UPDATE driven by arrays.

Outcomes that change engine columns only, or plain columns of the row's own (`array_type`:
whole numbers, floats, booleans, dates and times, text assigned from `text[]`, so a
`varchar(n)` is checked, never truncated), go in one UPDATE over `unnest()` of arrays,
fenced on each row's version, its attempt-log INSERT and NOTIFY as CTEs. Its text does not
change with the number of rows, so it is planned once; writes share it only when they
change the same columns. Everything else takes the typed path, `commits`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import Boolean, Integer, Row, case, cast, exists, func, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.base.clock import db_now, written_as_database_time
from engine.base.driver import fetch
from engine.base.errors import InvalidArgumentError
from engine.base.notify import announcement
from engine.commits.outcomes import (
    FAILURE_LOG_FIELDS,
    FIELD_TYPES,
    LOG_FIELDS,
    OUTCOME_FIELDS,
    Write,
    log_values,
    logs_failure,
    outcome_values,
    write_fields,
)
from engine.model.attempt_log import log_attempts
from engine.model.companions import (
    CompanionShape,
    array_parameter,
    array_type,
    companion_insert,
    companion_parameters,
    companion_shapes,
    unnest_arrays,
)
from engine.model.registry import WorkflowInfo
from engine.runs.waiting import ended, ended_announcement

STATEMENT_CACHE_SIZE = 256  # one statement per table and attempt log
# Per-row values, in the order of the unnest() columns after the key columns; the attempt
# record's only when an attempt log is written (six arrays fewer to send otherwise), and a
# failure's traceback and arguments only when a write of the batch logs one.
FAILURE_ROW_FIELDS: list[tuple[str, Any]] = [
    *((name, FIELD_TYPES[name]) for name in (*OUTCOME_FIELDS, *LOG_FIELDS, *FAILURE_LOG_FIELDS)),
    ("announce", Boolean),
    ("position", Integer),
]
ROW_FIELDS = [(n, t) for n, t in FAILURE_ROW_FIELDS if n not in FAILURE_LOG_FIELDS]
UNLOGGED_ROW_FIELDS = [(name, type_) for name, type_ in ROW_FIELDS if name not in LOG_FIELDS]


def row_fields(attempt_log: type[Any] | None, failures: bool = False) -> list[tuple[str, Any]]:
    """The per-row arrays of a statement that writes (or does not write) the attempt log,
    and a failure's traceback and arguments in it."""
    if attempt_log is None:
        return UNLOGGED_ROW_FIELDS
    return FAILURE_ROW_FIELDS if failures else ROW_FIELDS


def logged_fields(attempt_log: type[Any] | None, failures: bool) -> tuple[str, ...]:
    """The attempt record's fields a statement reads back to log them."""
    if attempt_log is None:
        return ()
    return (*LOG_FIELDS, *FAILURE_LOG_FIELDS) if failures else LOG_FIELDS


def takes(write: Write) -> bool:
    """Whether the fast path alone can commit this write: it fits, touching no other row."""
    return fast_columns(write) is not None and not write.needs_transaction


def fast_columns(write: Write) -> tuple[str, ...] | None:
    """The user columns this write changes if the fast path can write it, else None.

    It can when it arms no wait, takes no event key, is logged, and changes only
    columns of plain types.
    """
    outcome = write.outcome
    if write.record is None or outcome.pending == "wait" or outcome.recent_event_keys is not None:
        return None
    changed = tuple(sorted(outcome.changes))
    return changed if all_plain(write.claim.info, changed) else None


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def all_plain(info: WorkflowInfo, changed: tuple[str, ...]) -> bool:
    """Whether every column of `changed` can travel as an array (asked once per shape)."""
    return all(array_type(info.table.c[name]) is not None for name in changed)


async def fast_fenced_writes(
    conn: AsyncConnection, writes: Sequence[Write], *, attempt_log: type[Any] | None
) -> list[Row[Any] | None]:
    """Commit engine-only outcomes to rows of one table in one short statement."""
    info = writes[0].claim.info
    changed = tuple(sorted(writes[0].outcome.changes))
    if any(fast_columns(write) != changed for write in writes):
        raise InvalidArgumentError(
            "fast_fenced_writes() takes writes that change the same plain columns."
        )
    columns: dict[str, list[Any]] = {f"key{i}": [] for i in range(len(info.mapper.primary_key))}
    failures = attempt_log is not None and logs_failure(writes)
    fields_sent = row_fields(attempt_log, failures)
    columns.update({name: [] for name, _ in fields_sent})
    columns.update({f"set_{name}": [] for name in changed})
    for position, write in enumerate(writes):
        for i, value in enumerate(write.claim.key):
            columns[f"key{i}"].append(value)
        fields = write_fields(write)
        if fields["next_args"] is not None:
            fields["next_args"] = json.dumps(fields["next_args"])
        fields.update(announce=write.announce, position=position)
        for name, _ in fields_sent:
            columns[name].append(fields[name])
        for name in changed:
            columns[f"set_{name}"].append(write.outcome.changes[name])
    shapes = companion_shapes([c for write in writes for c in write.companions])
    for index, shape in enumerate(shapes):
        attached = [
            (position, c)
            for position, write in enumerate(writes)
            for c in write.companions
            if c.shape == shape
        ]
        columns.update(companion_parameters(shape, f"c{index}_", attached))
    # The row comes back whole only for a worker that runs its next step itself.
    whole = any(write.outcome.hold is not None for write in writes)
    statement = fast_statement(info, attempt_log, changed, shapes, whole, failures)  # type: ignore[arg-type]
    written: list[Row[Any] | None] = [None] * len(writes)
    for row in await fetch(conn, statement, unnest_arrays(columns)):
        written[row.v_position] = row
    return written


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def fast_statement(
    info: WorkflowInfo,
    attempt_log: type[Any] | None,
    changed: tuple[str, ...] = (),
    companions: tuple[CompanionShape, ...] = (),
    whole: bool = True,
    failures: bool = False,
) -> Executable:
    """The array-driven fenced UPDATE of one table (and its log INSERT), built once.

    `changed` are the user columns every write of the statement sets;
    `companions` the shapes of the rows its writes attached (written for the
    writes that land: `engine.model.companions`). With `whole`, each row comes back
    as written; without, only which writes landed (a step that finished or
    handed its run back reads nothing more, and decoding the row would cost
    it more than the UPDATE). With `failures`, the log keeps each write's traceback and
    arguments too (NULL for those that succeeded).
    """
    table = info.table
    keys = list(info.mapper.primary_key)
    sets = [(f"set_{name}", array_type(table.c[name])) for name in changed]
    arrays = [array_parameter(f"key{i}", column.type) for i, column in enumerate(keys)] + [
        array_parameter(name, type_) for name, type_ in (*row_fields(attempt_log, failures), *sets)
    ]
    names = (
        [f"v_key{i}" for i in range(len(keys))]
        + [f"v_{name}" for name, _ in row_fields(attempt_log, failures)]
        + [f"v_{name}" for name, _ in sets]
    )
    v = func.unnest(*arrays).table_valued(*names).render_derived(name="v", with_types=False)

    def value(name: str) -> Any:
        column = v.c[f"v_{name}"]
        return cast(column, JSONB) if name == "next_args" else column

    now = db_now()
    moved = (
        update(table)
        # The fence, row by row: each row is ours only at the version we claimed.
        .where(*(column == v.c[f"v_key{i}"] for i, column in enumerate(keys)))
        .where(table.c.wf_version == v.c.v_version)
        .values(
            {
                **outcome_values(table, value, now),
                # Assigned, not cast: PostgreSQL checks the column's own limits; a time the
                # database keeps is the commit's own.
                **{
                    table.c[name]: now
                    if written_as_database_time(table.c[name])
                    else v.c[f"v_set_{name}"]
                    for name in changed
                },
            }
        )
        .returning(
            *(table.c if whole else ()),
            # What the statement reads back: where each write goes, whether it is announced,
            # and (for the log) its attempt record; nothing else, so rows come back narrow.
            v.c.v_position,
            v.c.v_announce,
            ended(table).label("duly_ends"),
            *(v.c[f"v_{name}"] for name in logged_fields(attempt_log, failures)),
        )
        .cte("moved")
    )
    notified = case((moved.c.v_announce, announcement(table.name)), else_=None)
    # Runs this statement ended are announced to their waiters once (`engine.runs.waiting`).
    ends = select(ended_announcement(table.name)).where(
        exists().where(moved.c.duly_ends).select_from(moved)
    )
    query = select(
        moved, notified.label("duly_notified"), ends.scalar_subquery().label("duly_ended")
    )
    if attempt_log is not None:
        records = log_values(lambda name: moved.c[f"v_{name}"], failures)
        query = query.add_cte(log_attempts(attempt_log, table.name, records, moved).cte("logged"))
    for index, shape in enumerate(companions):
        written = companion_insert(shape, f"c{index}_", select(moved.c.v_position))
        query = query.add_cte(written.cte(f"companion_{index}"))
    return query
