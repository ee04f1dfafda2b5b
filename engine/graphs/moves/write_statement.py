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
    Boolean,
    Float,
    Integer,
    Select,
    Text,
    Uuid,
    any_,
    bindparam,
    case,
    cast,
    column,
    false,
    func,
    literal_column,
    null,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert
from sqlalchemy.sql import Update
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine, to_instance

from engine.base.clock import db_now
from engine.base.literals import SECOND, int_constant, text_constant
from engine.base.notify import announcement
from engine.events.database import EVENT_FIELDS, queue_events
from engine.graphs.moves.subjects import state_column
from engine.graphs.moves.writes import Shape
from engine.graphs.tables import APPROVED, PENDING, GraphTables
from engine.model.registry import WorkflowInfo, workflow_info
from engine.runs.handles import cancel_statement

EXPIRE_STEP = "expire"  # the timers' one step (engine.graphs.moves.timers.GraphTimer.expire)
NO_ARGUMENTS: dict[str, Any] = {"args": [], "kwargs": {}}  # `expire` takes none

DOCUMENT = "move_document"  # the one document parameter: every row to write, as JSON
INSTANCE_ID = "move_instance_id"  # the instance's id (parameters are named unlike any column: an
# UPDATE would take a parameter named after one of its columns as a SET)

# The rows of each part of the document, as (field, type): jsonb_to_recordset's columns.
Columns = tuple[tuple[str, TypeEngine[Any]], ...]
INSTANCE_CHANGED: Columns = (
    ("id", Uuid()),
    ("state_status", Text()),
    ("status", Text()),
    ("current_node_id", Uuid()),
    ("state_code", Text()),
    ("is_active", Boolean()),
    ("is_completed", Boolean()),
    ("branch_count", Integer()),
    ("done", Boolean()),  # completed by this transaction
)
INSTANCE_NEW: Columns = (
    *INSTANCE_CHANGED,
    ("template_id", Uuid()),
    ("subject_type", Text()),
    ("subject_key", Text()),
    ("submitted_by", Text()),
)
BRANCH_NEW: Columns = (
    ("id", Uuid()),
    ("number", Integer()),
    ("node", Uuid()),
    ("parent", Uuid()),
    ("scope", Uuid()),
    ("fork_node", Uuid()),
    ("join_node", Uuid()),
    ("status", Text()),
    ("done", Boolean()),
)
BRANCH_CHANGED: Columns = (
    ("id", Uuid()),
    ("node", Uuid()),
    ("status", Text()),
    ("done", Boolean()),
)
VISIT_NEW: Columns = (
    ("id", Uuid()),
    ("branch_id", Uuid()),
    ("node_id", Uuid()),
    ("step", Integer()),
    ("seconds", Float()),
)
VISIT_ENDED: Columns = (("id", Uuid()), ("status", Text()))
VOTE_CAST: Columns = (
    ("id", Uuid()),
    ("visit_id", Uuid()),
    ("approver", Text()),
    ("target", Uuid()),
    ("comment", Text()),
)
VOTES_CLOSED: Columns = (("visit_id", Uuid()), ("keep", Text()))
VOTE_NEW: Columns = (("id", Uuid()), ("visit_id", Uuid()), ("approver", Text()))
HISTORY: Columns = (
    ("position", Integer()),  # the order the runtime wrote them in
    ("visit_id", Uuid()),
    ("action_type", Text()),
    ("actor", Text()),
    ("acted_by", Text()),
    ("step_name", Text()),
    ("message", Text()),
    ("details", JSONB()),
)
TIMER_NEW: Columns = (("visit_id", Uuid()), ("branch_id", Uuid()), ("seconds", Float()))
TIMER_CANCELLED: Columns = (("visit_id", Uuid()),)
EVENT_COLUMNS: Columns = tuple((name, to_instance(type_)) for name, type_ in EVENT_FIELDS)


def _rows(document: Any, part: str, columns: Columns) -> Any:
    """The rows of one part of the document (`document -> 'part'`), as a typed table."""
    given = document.op("->")(literal_column(f"'{part}'"))
    rows = func.jsonb_to_recordset(given).table_valued(
        *(column(name, type_) for name, type_ in columns)
    )
    return rows.render_derived(name=f"{part}_rows", with_types=True)


def _among(key: Any, part: str, single: bool) -> Any:
    """`key` is one of the keys of the document's `part` rows (parameter `keys_<part>`):
    the key itself when `single` (the part has one row), else an array of them, so the
    rows are found through the key's index (docs/architecture.md says why)."""
    if single:
        return key == bindparam(f"keys_{part}", type_=key.type)
    return key == any_(bindparam(f"keys_{part}", type_=ARRAY(key.type)))


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
    its UPDATEs change come as arrays too (`_among`).
    """
    instances, branches, visits = (
        tables.table("instance"),
        tables.table("branch"),
        tables.table("visit"),
    )
    votes, history = tables.table("vote"), tables.table("history")
    # The document, parsed once, and the database clock, read once: every row of the
    # transaction has the same time.
    given = select(
        cast(bindparam(DOCUMENT, type_=Text()), JSONB).label("document"), db_now().label("now")
    ).cte("move")
    # In an INSERT ... SELECT the document's CTE is joined to the rows read from it; an
    # UPDATE (whose FROM cannot say JOIN) reads both through scalar subqueries.
    document, now = given.c.document, given.c.now
    document_value = select(given.c.document).scalar_subquery()
    now_value = select(given.c.now).scalar_subquery()
    instance_id = bindparam(INSTANCE_ID, type_=Uuid())
    ctes: list[Any] = []

    if shape.instance_new:
        rows = _rows(document, "instance", INSTANCE_NEW)
        ctes.append(
            insert(instances)
            .from_select(
                [
                    "id",
                    "template_id",
                    "subject_type",
                    "subject_key",
                    "submitted_by",
                    "submitted_at",
                    "completed_at",
                    *(name for name, _ in INSTANCE_CHANGED[1:-1]),
                ],
                _bare(
                    given,
                    rows,
                    rows.c.id,
                    rows.c.template_id,
                    rows.c.subject_type,
                    rows.c.subject_key,
                    rows.c.submitted_by,
                    now,
                    case((rows.c.done, now), else_=null()),
                    *(rows.c[name] for name, _ in INSTANCE_CHANGED[1:-1]),
                ),
            )
            .cte("instance_new")
        )
    if shape.instance_changed:
        rows = _rows(document_value, "instance", INSTANCE_CHANGED)
        ctes.append(
            update(instances)
            # The one row of "instance" is the instance itself: found by the key it is given.
            .where(instances.c.id == instance_id, instances.c.id == rows.c.id)
            .values(
                {
                    **{name: rows.c[name] for name, _ in INSTANCE_CHANGED[1:-1]},
                    "completed_at": case((rows.c.done, now_value), else_=instances.c.completed_at),
                }
            )
            .cte("instance_changed")
        )
    if shape.branches_new:
        rows = _rows(document, "branches_new", BRANCH_NEW)
        ctes.append(
            insert(branches)
            .from_select(
                [
                    "id",
                    "instance_id",
                    "number",
                    "current_node_id",
                    "parent_branch_id",
                    "fork_scope",
                    "fork_node_id",
                    "join_node_id",
                    "status",
                    "started_at",
                    "completed_at",
                ],
                _bare(
                    given,
                    rows,
                    rows.c.id,
                    instance_id,
                    rows.c.number,
                    rows.c.node,
                    rows.c.parent,
                    rows.c.scope,
                    rows.c.fork_node,
                    rows.c.join_node,
                    rows.c.status,
                    now,
                    case((rows.c.done, now), else_=null()),
                ),
            )
            .cte("branches_new")
        )
    if shape.branches_changed:
        rows = _rows(document_value, "branches_changed", BRANCH_CHANGED)
        ctes.append(
            update(branches)
            .where(branches.c.id == rows.c.id)
            .where(_among(branches.c.id, "branches_changed", shape.single_keys))
            .values(
                current_node_id=rows.c.node,
                status=rows.c.status,
                completed_at=case((rows.c.done, now_value), else_=branches.c.completed_at),
            )
            .cte("branches_changed")
        )
    if shape.visits_new:
        rows = _rows(document, "visits_new", VISIT_NEW)
        seen = visits.alias("seen")
        # Iterations count per (instance, node), 1, 2, ...: the visits before this
        # statement, plus this transaction's own position among its entries of the node.
        before = (
            select(func.count())
            .where(seen.c.instance_id == instance_id, seen.c.node_id == rows.c.node_id)
            .scalar_subquery()
        )
        ctes.append(
            insert(visits)
            .from_select(
                [
                    "id",
                    "instance_id",
                    "branch_id",
                    "node_id",
                    "status",
                    "is_current",
                    "iteration",
                    "deadline_at",
                    "entered_at",
                ],
                _bare(
                    given,
                    rows,
                    rows.c.id,
                    instance_id,
                    rows.c.branch_id,
                    rows.c.node_id,
                    text_constant(PENDING),
                    true(),
                    before + rows.c.step,
                    deadline(rows.c.seconds, now),  # NULL seconds: no deadline
                    now,
                ),
            )
            .cte("visits_new")
        )
    if shape.visits_ended:
        rows = _rows(document_value, "visits_ended", VISIT_ENDED)
        ctes.append(
            update(visits)
            .where(visits.c.id == rows.c.id)
            .where(_among(visits.c.id, "visits_ended", shape.single_keys))
            .values(status=rows.c.status, is_current=false(), completed_at=now_value)
            .cte("visits_ended")
        )
    if shape.vote_cast:
        rows = _rows(document, "vote_cast", VOTE_CAST)
        cast_vote = insert(votes).from_select(
            [
                "id",
                "visit_id",
                "instance_id",
                "approver",
                "status",
                "target_node_id",
                "is_available",
                "comment",
                "acted_at",
            ],
            _bare(
                given,
                rows,
                rows.c.id,
                rows.c.visit_id,
                instance_id,
                rows.c.approver,
                text_constant(APPROVED),
                rows.c.target,
                true(),
                rows.c.comment,
                now,
            ),
        )
        ctes.append(
            cast_vote.on_conflict_do_update(
                index_elements=[votes.c.visit_id, votes.c.approver],
                set_={
                    "status": cast_vote.excluded.status,
                    "target_node_id": cast_vote.excluded.target_node_id,
                    "comment": cast_vote.excluded.comment,
                    "acted_at": cast_vote.excluded.acted_at,
                },
            ).cte("vote_cast")
        )
    if shape.votes_closed:
        rows = _rows(document_value, "votes_closed", VOTES_CLOSED)
        ctes.append(
            update(votes)
            .where(
                votes.c.visit_id == rows.c.visit_id,
                _among(votes.c.visit_id, "votes_closed", shape.single_keys),
                votes.c.status == text_constant(PENDING),
                # The vote cast by this transaction is its own CTE's row.
                votes.c.approver.is_distinct_from(rows.c.keep),
            )
            .values(is_available=false())
            .cte("votes_closed")
        )
    if shape.votes_new:
        rows = _rows(document, "votes_new", VOTE_NEW)
        ctes.append(
            insert(votes)
            .from_select(
                ["id", "visit_id", "instance_id", "approver", "status", "is_available", "comment"],
                _bare(
                    given,
                    rows,
                    rows.c.id,
                    rows.c.visit_id,
                    instance_id,
                    rows.c.approver,
                    text_constant(PENDING),
                    true(),
                    text_constant(""),
                ),
            )
            .cte("votes_new")
        )
    if shape.history:
        rows = _rows(document, "history", HISTORY)
        ctes.append(
            insert(history)
            .from_select(
                [
                    *("instance_id", "visit_id", "action_type", "actor", "acted_by"),
                    *("step_name", "message", "metadata", "created_at"),
                ],
                _bare(
                    given,
                    rows,
                    instance_id,
                    rows.c.visit_id,
                    rows.c.action_type,
                    rows.c.actor,
                    rows.c.acted_by,
                    rows.c.step_name,
                    rows.c.message,
                    rows.c.details,
                    now,
                    # Ids (the identity) are drawn in this order: the order they were written.
                ).order_by(rows.c.position),
            )
            .cte("history_new")
        )
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


def _subject_update(cls: type[Any], document: Any) -> Any:
    table = cls.__table__
    keys = list(table.primary_key.columns)
    columns: Columns = (("code", Text()), *((f"key_{i}", key.type) for i, key in enumerate(keys)))
    given = _rows(document, "subject", columns)
    return (
        update(table)
        # One subject a statement: its key given as scalars, which its index answers.
        .where(*(_among(key, f"subject_key_{i}", True) for i, key in enumerate(keys)))
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


def deadline(seconds: ColumnElement[Any], now: ColumnElement[Any] | None = None) -> Any:
    """`now` (the database clock) plus `seconds`: a visit's deadline and its timer's alike."""
    start = db_now() if now is None else now
    return start + seconds * SECOND
