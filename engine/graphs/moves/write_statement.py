"""The one statement that writes what a move decided, built once per shape of its rows.

Data-modifying CTEs read their rows from one JSON document (parsed once);
the rows its UPDATEs change are also given as keys, so each is found through
its index. docs/architecture.md ("Graph workflows") says why.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, cast as typing_cast

from sqlalchemy import (
    LABEL_STYLE_NONE,
    Select,
    Text,
    Uuid,
    bindparam,
    cast,
    column,
    func,
    literal_column,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.sql import Update
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import to_instance

from engine.base.clock import db_now
from engine.base.literals import int_constant, text_constant
from engine.base.notify import announcement
from engine.events.database import EVENT_FIELDS, queue_events
from engine.graphs.moves.subjects import state_column
from engine.graphs.moves.write_parts import (
    PARTS,
    TIMER_CANCELLED,
    TIMER_NEW,
    Columns,
    Found,
    Part,
    among,
    deadline,
)
from engine.graphs.moves.writes import Shape
from engine.graphs.tables import GraphTables
from engine.model.registry import WorkflowInfo, workflow_info
from engine.runs.handles import cancel_statement

EXPIRE_STEP = "expire"  # the timers' one step (engine.graphs.moves.timers.GraphTimer.expire)
NO_ARGUMENTS: dict[str, Any] = {"args": [], "kwargs": {}}  # `expire` takes none

DOCUMENT = "move_document"  # the one document parameter: every row to write, as JSON
INSTANCE_ID = "move_instance_id"  # the instance's id (parameters are named unlike any column: an
# UPDATE would take a parameter named after one of its columns as a SET)

EVENT_COLUMNS: Columns = tuple((name, to_instance(type_)) for name, type_ in EVENT_FIELDS)


def _rows(document: Any, part: str, columns: Columns) -> Any:
    """The rows of one part of the document (`document -> 'part'`), as a typed table."""
    given = document.op("->")(literal_column(f"'{part}'"))
    rows = func.jsonb_to_recordset(given).table_valued(
        *(column(name, type_) for name, type_ in columns)
    )
    return rows.render_derived(name=f"{part}_rows", with_types=True)


def _bare(given: Any, rows: Any, *columns: Any) -> Select[Any]:
    """SELECT `columns` from the given rows, read from the document beside them, unlabelled."""
    joined = given.join(rows, true())
    return select(*columns).select_from(joined).set_label_style(LABEL_STYLE_NONE)


@lru_cache(maxsize=256)
def write_statement(tables: GraphTables, shape: Shape) -> Select[Any]:
    """The one statement that writes a transaction's rows of `shape`.

    Its two parameters are the instance's id and one JSON document holding
    every row, which PostgreSQL parses once (the `move` CTE) and each part
    of the statement reads with jsonb_to_recordset; the keys of the rows
    its UPDATEs change come as arrays too (`among`).
    """
    # The document, parsed once, and the database clock, read once: every row of the
    # transaction has the same time.
    given = select(
        cast(bindparam(DOCUMENT, type_=Text()), JSONB).label("document"), db_now().label("now")
    ).cte("move")
    # An UPDATE (whose FROM cannot say JOIN) reads both through scalar subqueries; so do
    # the parts after the table's.
    document_value = select(given.c.document).scalar_subquery()
    now_value = select(given.c.now).scalar_subquery()
    instance_id = bindparam(INSTANCE_ID, type_=Uuid())
    read = (given, document_value, now_value)
    ctes: list[Any] = [
        _part(part, tables, read, instance_id, shape.single_keys)
        for part in PARTS
        if getattr(shape, part.flag or part.cte)
    ]
    if shape.subject is not None:
        ctes.append(_subject_update(shape.subject, document_value).cte("subject_state"))
    announced: list[ColumnElement[Any]] = []
    if shape.timers_cancelled and tables.timer is not None:
        rows = _rows(document_value, "timers_cancelled", TIMER_CANCELLED)
        info = workflow_info(tables.timer)
        ended = cancel_statement(info, [info.table.c.visit_id.in_(select(rows.c.visit_id))])
        ctes.append(typing_cast(Update, ended).cte("timers_cancelled"))
    if shape.timers_new and tables.timer is not None:
        rows = _rows(document_value, "timers_new", TIMER_NEW)
        info = workflow_info(tables.timer)
        ctes.append(timer_insert(info, rows, instance_id, now_value).cte("timers_new"))
        # The workers recompute their next instant (the deadline) when this commits.
        announced.append(announcement(info.name).label("duly_notified"))
    if shape.events is not None:
        # The notifications, stored and queued in the outbox as `publish_many` stores them.
        queued = queue_events(shape.events, _rows(document_value, "events", EVENT_COLUMNS))
        told = select(announcement(shape.events.outbox_table.name)).select_from(queued).limit(1)
        ctes.append(queued)
        announced += [
            select(func.count()).select_from(queued).scalar_subquery().label("events_queued"),
            told.scalar_subquery().label("outbox_notified"),  # as `publish_many` announces
        ]
    return select(given.c.now.label("written_at"), *announced).add_cte(given, *ctes)


def _part(
    part: Part, tables: GraphTables, read: tuple[Any, Any, Any], instance_id: Any, single: bool
) -> Any:
    """The CTE of one part, its rows read from the document of the `move` CTE (`read`: that
    CTE, and its document and clock as scalar subqueries).

    An INSERT ... SELECT joins the document's CTE to the rows read from it; an UPDATE
    reads both through the scalar subqueries.
    """
    given, document_value, now_value = read
    table = tables.table(part.table)
    if part.where is None:
        document, now = given.c.document, given.c.now
    else:
        document, now = document_value, now_value
    rows = _rows(document, part.rows or part.cte, part.columns)
    found = Found(rows, table, instance_id, now, single)
    values = {
        name: rows.c[source] if isinstance(source, str) else source(found)
        for name, source in part.values
    }
    if part.where is not None:
        return update(table).where(*part.where(found)).values(values).cte(part.cte)
    chosen = _bare(given, rows, *values.values())
    if part.order is not None:
        chosen = chosen.order_by(rows.c[part.order])
    written = insert(table).from_select(list(values), chosen)
    if part.upsert is not None:
        keys, changed = part.upsert
        written = written.on_conflict_do_update(
            index_elements=[table.c[key] for key in keys],
            set_={name: written.excluded[name] for name in changed},
        )
    return written.cte(part.cte)


def _subject_update(cls: type[Any], document: Any) -> Any:
    table = cls.__table__
    keys = list(table.primary_key.columns)
    columns: Columns = (("code", Text()), *((f"key_{i}", key.type) for i, key in enumerate(keys)))
    given = _rows(document, "subject", columns)
    return (
        update(table)
        # One subject a statement: its key given as scalars, which its index answers.
        .where(*(among(key, f"subject_key_{i}", True) for i, key in enumerate(keys)))
        .where(*(key == given.c[f"key_{i}"] for i, key in enumerate(keys)))
        .values({table.c[state_column(cls)]: given.c.code})
    )


def timer_insert(
    info: WorkflowInfo, rows: Any, instance_id: ColumnElement[Any], now: ColumnElement[Any]
) -> Any:
    """Timers for `rows` (visit_id, branch_id, seconds) of an instance, due at their deadline.

    Built as `engine.runs.start.insert_run` builds a run: the first step named, its
    arguments, no attempts yet, version 0; only the time differs (the deadline).
    """
    table = info.table
    return insert(table).from_select(
        [
            "visit_id",
            "instance_id",
            "branch_id",
            "next_step",
            "next_args",
            "wake_at",
            "attempts",
            "wf_version",
        ],
        select(
            rows.c.visit_id,
            instance_id,
            rows.c.branch_id,
            text_constant(EXPIRE_STEP),
            literal_column(f"'{json.dumps(NO_ARGUMENTS)}'", table.c.next_args.type),
            deadline(rows.c.seconds, now),
            int_constant(0),
            int_constant(0),
        ),
    )
