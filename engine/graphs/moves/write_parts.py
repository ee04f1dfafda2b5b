"""The parts of a move's write statement, as a table: each CTE's table, rows and values.

`engine.graphs.moves.write_statement` walks `PARTS` with one builder; the
parts no table row describes (the subject, the timers, the events) are its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    Text,
    Uuid,
    any_,
    bindparam,
    case,
    false,
    func,
    null,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from engine.base.clock import db_now
from engine.base.literals import SECOND, text_constant
from engine.graphs.tables import APPROVED, PENDING

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
STATE: tuple[str, ...] = tuple(name for name, _ in INSTANCE_CHANGED[1:-1])  # an instance's state


@dataclass(frozen=True)
class Found:
    """What a part's values and conditions are built from."""

    rows: Any  # the part's rows, read from the document
    table: Any  # the table it writes
    instance_id: Any  # the instance's id (a parameter)
    now: Any  # the database clock, read once by the statement
    single: bool  # each row found by key is the only one: its key is a scalar


Source = str | Callable[[Found], Any]  # a field of the part's rows, or a value built from them


@dataclass(frozen=True)
class Part:
    """One data-modifying CTE: an INSERT of the document's rows, or an UPDATE by their keys."""

    cte: str  # the CTE's name
    table: str  # the graph table written (`GraphTables.table`)
    columns: Columns  # the fields of its rows
    values: tuple[tuple[str, Source], ...]  # each column written, and what it is written with
    where: Callable[[Found], tuple[Any, ...]] | None = None  # an UPDATE's rows; None: an INSERT
    order: str | None = None  # the field an INSERT takes its rows in the order of
    upsert: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # conflict keys, columns set
    rows: str = ""  # the part of the document its rows are read from, if not named `cte`
    flag: str = ""  # the field of `Shape` that says the statement has it, if not `cte`


def _same(*names: str) -> tuple[tuple[str, Source], ...]:
    """Columns written with the document's fields of their own names."""
    return tuple((name, name) for name in names)


def _now(found: Found) -> Any:
    return found.now


def _instance(found: Found) -> Any:
    return found.instance_id


def _done_now(found: Found) -> Any:
    """A new row's completion: the clock if this move completed it, else NULL."""
    return case((found.rows.c.done, found.now), else_=null())


def _done_kept(found: Found) -> Any:
    """A changed row's completion: the clock if this move completed it, else as it was."""
    return case((found.rows.c.done, found.now), else_=found.table.c.completed_at)


def _constant(value: Callable[[], Any]) -> Callable[[Found], Any]:
    return lambda _: value()


def _iteration(found: Found) -> Any:
    """Iterations count per (instance, node), 1, 2, ...: the visits before this statement,
    plus this transaction's own position among its entries of the node."""
    seen = found.table.alias("seen")
    before = (
        select(func.count())
        .where(seen.c.instance_id == found.instance_id, seen.c.node_id == found.rows.c.node_id)
        .scalar_subquery()
    )
    return before + found.rows.c.step


def _deadline(found: Found) -> Any:
    return deadline(found.rows.c.seconds, found.now)  # NULL seconds: no deadline


def _by_key(part: str) -> Callable[[Found], tuple[Any, ...]]:
    """Rows that are the rows of the document's `part`, found by their keys (`id`)."""

    def where(found: Found) -> tuple[Any, ...]:
        key = found.table.c.id
        return key == found.rows.c.id, among(key, part, found.single)

    return where


def _the_instance(found: Found) -> tuple[Any, ...]:
    """The one row of "instance" is the instance itself: found by the key it is given."""
    return found.table.c.id == found.instance_id, found.table.c.id == found.rows.c.id


def _open_votes(found: Found) -> tuple[Any, ...]:
    """The pending votes of a closed visit, but the one cast by this transaction (its own
    CTE's row)."""
    votes = found.table.c
    return (
        votes.visit_id == found.rows.c.visit_id,
        among(votes.visit_id, "votes_closed", found.single),
        votes.status == text_constant(PENDING),
        votes.approver.is_distinct_from(found.rows.c.keep),
    )


# The parts of the statement, in the order it writes them.
PARTS: tuple[Part, ...] = (
    Part(
        "instance_new",
        "instance",
        INSTANCE_NEW,
        (
            *_same("id", "template_id", "subject_type", "subject_key", "submitted_by"),
            ("submitted_at", _now),
            ("completed_at", _done_now),
            *_same(*STATE),
        ),
        rows="instance",
    ),
    Part(
        "instance_changed",
        "instance",
        INSTANCE_CHANGED,
        (*_same(*STATE), ("completed_at", _done_kept)),
        where=_the_instance,
        rows="instance",
    ),
    Part(
        "branches_new",
        "branch",
        BRANCH_NEW,
        (
            ("id", "id"),
            ("instance_id", _instance),
            ("number", "number"),
            ("current_node_id", "node"),
            ("parent_branch_id", "parent"),
            ("fork_scope", "scope"),
            ("fork_node_id", "fork_node"),
            ("join_node_id", "join_node"),
            ("status", "status"),
            ("started_at", _now),
            ("completed_at", _done_now),
        ),
    ),
    Part(
        "branches_changed",
        "branch",
        BRANCH_CHANGED,
        (("current_node_id", "node"), ("status", "status"), ("completed_at", _done_kept)),
        where=_by_key("branches_changed"),
    ),
    Part(
        "visits_new",
        "visit",
        VISIT_NEW,
        (
            ("id", "id"),
            ("instance_id", _instance),
            ("branch_id", "branch_id"),
            ("node_id", "node_id"),
            ("status", _constant(lambda: text_constant(PENDING))),
            ("is_current", _constant(true)),
            ("iteration", _iteration),
            ("deadline_at", _deadline),
            ("entered_at", _now),
        ),
    ),
    Part(
        "visits_ended",
        "visit",
        VISIT_ENDED,
        (("status", "status"), ("is_current", _constant(false)), ("completed_at", _now)),
        where=_by_key("visits_ended"),
    ),
    Part(
        "vote_cast",
        "vote",
        VOTE_CAST,
        (
            ("id", "id"),
            ("visit_id", "visit_id"),
            ("instance_id", _instance),
            ("approver", "approver"),
            ("status", _constant(lambda: text_constant(APPROVED))),
            ("target_node_id", "target"),
            ("is_available", _constant(true)),
            ("comment", "comment"),
            ("acted_at", _now),
        ),
        upsert=(("visit_id", "approver"), ("status", "target_node_id", "comment", "acted_at")),
    ),
    Part(
        "votes_closed",
        "vote",
        VOTES_CLOSED,
        (("is_available", _constant(false)),),
        where=_open_votes,
    ),
    Part(
        "votes_new",
        "vote",
        VOTE_NEW,
        (
            ("id", "id"),
            ("visit_id", "visit_id"),
            ("instance_id", _instance),
            ("approver", "approver"),
            ("status", _constant(lambda: text_constant(PENDING))),
            ("is_available", _constant(true)),
            ("comment", _constant(lambda: text_constant(""))),
        ),
    ),
    Part(
        "history_new",
        "history",
        HISTORY,
        (
            ("instance_id", _instance),
            *_same("visit_id", "action_type", "actor", "acted_by", "step_name", "message"),
            ("metadata", "details"),
            ("created_at", _now),
        ),
        # Ids (the identity) are drawn in this order: the order they were written.
        order="position",
        rows="history",
        flag="history",
    ),
)


def among(key: Any, part: str, single: bool) -> Any:
    """`key` is one of the keys of the document's `part` rows (parameter `keys_<part>`):
    the key itself when `single` (the part has one row), else an array of them, so the
    rows are found through the key's index (docs/architecture.md says why)."""
    if single:
        return key == bindparam(f"keys_{part}", type_=key.type)
    return key == any_(bindparam(f"keys_{part}", type_=ARRAY(key.type)))


def deadline(seconds: ColumnElement[Any], now: ColumnElement[Any] | None = None) -> Any:
    """`now` (the database clock) plus `seconds`: a visit's deadline and its timer's alike."""
    start = db_now() if now is None else now
    return start + seconds * SECOND
