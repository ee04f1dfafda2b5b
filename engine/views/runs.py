"""What an operator reads of a workflow's runs: a page of them, and how a run's key is spelled.

    page = await list_runs(connection, info, RunFilter(state="failed"))   # newest first
    page = await list_runs(connection, info, order="soonest", after=page.next_after)

The HTTP API, the console and `duly runs` all read through these. A page goes
on from a cursor through an index (newest: the primary key's backwards, or the index of the
own column a filter bounds; soonest: the due index, then the unscheduled runs by key), and a
filter looks at the next `SCAN_WINDOW` rows of that walk only.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Text,
    cast,
    func,
    literal,
    or_,
    select,
    tuple_,
)
from sqlalchemy.orm import aliased
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql import util as sql_util
from sqlalchemy.types import JSON

from engine.base.errors import DulyError, NotFoundError
from engine.base.shown import bounded_value, json_value, loads_shown
from engine.model.connection import WorkflowConnection
from engine.model.registry import ENGINE_COLUMNS, WorkflowInfo
from engine.runs.keys import RunKey as RunKey, key_text_of as key_text_of
from engine.views.filters import (
    MAX_FILTER_TEXT as MAX_FILTER_TEXT,
    ColumnCondition,
    RunFilter as RunFilter,
    parse_filter as parse_filter,
    parse_key as parse_key,
    typed_value,
)
from engine.views.overview import run_state

RUN_ORDERS = ("newest", "soonest")
DEFAULT_PAGE = 50  # runs
MAX_PAGE = 500  # runs
SHOWN_ENGINE_COLUMNS = ("next_step", "next_args", "wake_at", "attempts", "last_error")
HIDDEN_COLUMNS = frozenset(ENGINE_COLUMNS) - set(SHOWN_ENGINE_COLUMNS)
LOG_RUN_COLUMNS = ("workflow", "run_key")  # of the attempt log: the run names them already
MAX_CHILDREN = 20  # children a run's page lists per table
SCAN_WINDOW = 5_000  # rows a page reads at most in each walk: a filter's cost is bounded
# States whose rows have no step scheduled, and those whose rows all have one: a soonest
# page skips the half of its walk that cannot hold them.
UNSCHEDULED_STATES = frozenset({"finished", "failed", "cancelled"})
SCHEDULED_STATES = frozenset({"scheduled", "retrying"})


# -- keys and cursors -------------------------------------------------------------------------


def find_workflow(connection: WorkflowConnection, name: str) -> WorkflowInfo:
    """The workflow table `name` the connection serves; NotFoundError naming those it serves
    when it serves none of that name (every door, API, console and command line, says this)."""
    for info in connection.workflows:
        if info.name == name:
            return info
    mapped = ", ".join(sorted(info.name for info in connection.workflows))
    raise NotFoundError(
        f"No workflow named {name!r}. "
        + (f"This app maps: {mapped}." if mapped else "This app maps no workflow.")
    )


def key_text(info: WorkflowInfo, row: Any) -> str:
    """A run's key as its URL spells it: the value, or a JSON list for a composite key."""
    return key_text_of(info.mapper.primary_key_from_instance(row))


@dataclass(frozen=True)
class Cursor:
    """Where a page ends: the order, the walk (`n`ewest, `s`cheduled, `r`est or a `c`olumn's),
    its due time (`s`) or the walked column's value (`c`), and its key."""

    order: str
    walk: str
    key: tuple[Any, ...]
    wake_at: datetime | None = None
    value: Any = None  # of the column a `c` walk follows
    column: str | None = None  # the column a `c` walk follows

    def encode(self) -> str:
        """The cursor as URL-safe text."""
        keys = [json_value(k) for k in self.key]
        document: dict[str, Any] = {"o": self.order, "p": self.walk, "k": keys}
        if self.wake_at is not None:
            document["w"] = self.wake_at.isoformat()
        if self.walk == "c":
            document["c"], document["v"] = self.column, json_value(self.value)
        raw = json.dumps(document, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(
        cls, info: WorkflowInfo, text: str, order: str, walked: ColumnCondition | None = None
    ) -> Cursor:
        """A cursor given back; a DulyError when it is not one this module wrote for `order`
        (and, on a newest page that walks a column's index, for that column)."""
        refused = DulyError(
            f"{text[:80]!r} is not a page cursor of {info.name}'s {order} runs: "
            "page on from the link a page gave."
        )
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            document = json.loads(raw)
            walk, parts = document["p"], document["k"]
            wake_at = datetime.fromisoformat(document["w"]) if "w" in document else None
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise refused from None
        columns = list(info.mapper.primary_key)
        newest = "n" if walked is None else "c"
        valid_walk = walk in ("s", "r") if order == "soonest" else walk == newest
        if document.get("o") != order or not valid_walk or not isinstance(parts, list):
            raise refused
        if len(parts) != len(columns) or (walk == "s") != (wake_at is not None):
            raise refused
        if (walk == "c") != ("v" in document):
            raise refused
        if walked is not None and document.get("c") != walked.column:
            raise refused  # a cursor of pages by another column
        try:
            key = tuple(typed_value(info, c, p) for c, p in zip(columns, parts, strict=True))
            value = None
            if walked is not None:
                value = typed_value(info, info.table.c[walked.column], document["v"])
        except DulyError:
            raise refused from None
        return cls(order, walk, key, wake_at, value, document.get("c"))


# -- a page of runs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """One run as a list shows it: its state, its row (the engine's bookkeeping left out)."""

    workflow: str
    key: str
    state: str
    row: dict[str, Any]  # by column name
    waiting_for: str | None
    deadline: Any  # when a wait with a timeout gives up (ISO text, as the engine stores it)
    held_event: dict[str, Any] | None
    parent: dict[str, Any] | None
    children_left: int | None

    def to_dict(self) -> dict[str, Any]:
        """The run as the API answers it (values still Python's: encode them for JSON)."""
        return {
            "key": self.key,
            "state": self.state,
            "row": self.row,
            "waiting_for": self.waiting_for,
            "deadline": self.deadline,
            "held_event": self.held_event,
            "parent": self.parent,
            "children_left": self.children_left,
        }


@dataclass(frozen=True)
class RunPage:
    """A page of runs and where the next one starts."""

    workflow: str
    order: str
    runs: list[RunSummary]
    next_after: str | None  # the cursor of the next page; None on the last
    next_offset: int | None  # the same page by offset, for clients that page so
    # The page ended where its search window did, not because it was full: `next_after`
    # goes on searching from there (a filter few runs match, over many runs).
    searching: bool = False


def summarize(info: WorkflowInfo, row: Any) -> RunSummary:
    """A run instance as a RunSummary."""
    shown = {
        column.name: bounded_value(getattr(row, info.mapper.get_property_by_column(column).key))
        for column in info.table.c
        if column.name not in HIDDEN_COLUMNS
    }
    waiting = row.waiting_for is not None
    held = row.pending_event
    return RunSummary(
        workflow=info.name,
        key=key_text(info, row),
        state=run_state(row),
        row=shown,
        waiting_for=row.waiting_for,
        deadline=(row.next_args or {}).get("deadline") if waiting else None,
        held_event=None if held is None else bounded_value(dict(held)),
        parent=row.parent,
        children_left=row.children_left,
    )


async def list_runs(
    connection: WorkflowConnection,
    info: WorkflowInfo,
    filters: RunFilter | None = None,
    *,
    order: str = "newest",
    limit: int = DEFAULT_PAGE,
    after: str | None = None,
    offset: int = 0,
) -> RunPage:
    """A page of `info`'s runs in `order`, after the cursor `after` (or skipping `offset`).

    A page (unless by offset) reads at most SCAN_WINDOW rows of each walk: a
    filter few runs match ends the page early, with `searching` set and the
    cursor where the search stopped.
    """
    if order not in RUN_ORDERS:
        raise DulyError(f"No order {order!r}: use one of {', '.join(RUN_ORDERS)}.")
    if not 1 <= limit <= MAX_PAGE:
        raise DulyError(f"A page holds 1 to {MAX_PAGE} runs, not {limit}.")
    if offset < 0 or (offset and after is not None):
        raise DulyError("Page with a cursor or with an offset of 0 or more, not both.")
    filters = filters or RunFilter()
    # A newest page with a condition on an indexed column walks that column's index.
    walked = filters.walked() if order == "newest" else None
    where = filters.clauses(info, walked=walked is not None)
    cursor = Cursor.decode(info, after, order, walked) if after is not None else None
    newest = ("n",) if walked is None else ("c",)
    walks = newest if order == "newest" else soonest_walks(filters.state)
    if cursor is not None:
        walks = walks[walks.index(cursor.walk) :] if cursor.walk in walks else ()
    windowed = filters.key is None  # one key is one row, found through the primary key
    along = None if walked is None else walked.column  # the column a `c` cursor names

    async def read(as_text: bool) -> tuple[list[tuple[Any, str]], Cursor | None]:
        found: list[tuple[Any, str]] = []
        async with connection.sessionmaker() as session:
            if offset:
                page = _offset_page(session, info, where, walks, limit, offset, as_text, walked)
                return await page, None
            for walk in walks:
                start = cursor if cursor is not None and cursor.walk == walk else None
                want = limit + 1 - len(found)
                statement = walk_statement(
                    info, walk, where, start, want, windowed=windowed, walked=walked
                )
                found += [(row, walk) for row in await rows_of(session, info, statement, as_text)]
                if len(found) > limit:
                    break
                if not windowed:
                    continue
                ending = window_end_statement(info, walk, start, walked)
                end = (await session.execute(ending)).first()
                if end is not None:  # the window ran out before the walk did: stop here
                    return found, Cursor(
                        order,
                        walk,
                        tuple(end)[1:],
                        end[0] if walk == "s" else None,
                        end[0] if walk == "c" else None,
                        along,
                    )
        return found, None

    try:
        found, stopped = await read(as_text=False)
    except RecursionError:  # a JSON value stored deeper than json.loads can decode
        found, stopped = await read(as_text=True)
    more = len(found) > limit
    shown = found[:limit]
    next_after = stopped.encode() if stopped is not None and not more else None
    if more:
        last, walk = shown[-1]
        key = tuple(info.mapper.primary_key_from_instance(last))
        value = None
        if walked is not None:
            column = info.table.c[walked.column]
            value = getattr(last, info.mapper.get_property_by_column(column).key)
        at = last.wake_at if walk == "s" else None
        next_after = Cursor(order, walk, key, at, value, along).encode()
    return RunPage(
        workflow=info.name,
        order=order,
        runs=[summarize(info, row) for row, _ in shown],
        next_after=next_after,
        next_offset=offset + limit if more and after is None else None,
        searching=stopped is not None and not more,
    )


async def _offset_page(
    session: Any,
    info: WorkflowInfo,
    where: list[ColumnElement[bool]],
    walks: Sequence[str],
    limit: int,
    offset: int,
    as_text: bool,
    walked: ColumnCondition | None = None,
) -> list[tuple[Any, str]]:
    """A page by offset, as the API always allowed: it reads every row it skips."""
    found: list[tuple[Any, str]] = []
    for walk in walks:
        if walk == "s" and "r" in walks:
            count = select(func.count()).select_from(info.table)
            count = count.where(*where, info.table.c.next_step.isnot(None))
            scheduled_rows = int((await session.execute(count)).scalar_one())
            if offset >= scheduled_rows:
                offset -= scheduled_rows
                continue
        want = limit + 1 - len(found)
        statement = walk_statement(info, walk, where, None, want, offset=offset, walked=walked)
        found += [(row, walk) for row in await rows_of(session, info, statement, as_text)]
        offset = 0
        if len(found) > limit:
            break
    return found


async def rows_of(session: Any, info: WorkflowInfo, statement: Any, as_text: bool) -> list[Any]:
    """The runs `statement` selects; with `as_text`, each one's JSON read as text (shown_row)."""
    if not as_text:
        return list((await session.scalars(statement)).all())
    columns = [  # the statement's own columns: a walk's window names them on its subquery
        cast(c, Text).label(c.name) if isinstance(c.type, JSON) else c
        for c in statement.selected_columns
    ]
    rows = await session.execute(statement.with_only_columns(*columns))
    return [shown_row(info, found._mapping) for found in rows]


def shown_row(info: WorkflowInfo, values: Mapping[str, Any]) -> Any:
    """A run built from its columns' values, its JSON text decoded by loads_shown.

    A transient instance, never added to a session: a read's copy, its deepest JSON TRUNCATED.
    """
    row = info.mapper.class_manager.new_instance()
    for column in info.table.c:
        value = values[column.name]
        shown = loads_shown(value) if isinstance(column.type, JSON) else value
        set_committed_value(row, info.mapper.get_property_by_column(column).key, shown)
    return row


def soonest_walks(state: str | None) -> tuple[str, ...]:
    """The walks a soonest page takes for `state`: scheduled rows, then the rest."""
    if state in UNSCHEDULED_STATES:
        return ("r",)
    if state in SCHEDULED_STATES:
        return ("s",)
    return ("s", "r")


def _after_key(info: WorkflowInfo, key: tuple[Any, ...], newer: bool) -> ColumnElement[bool]:
    """The rows whose key comes after `key`: lower keys when `newer`-first, else higher."""
    columns = list(info.mapper.primary_key)
    left: Any
    right: Any
    if len(columns) == 1:
        left, right = columns[0], literal(key[0], columns[0].type)
    else:
        left, right = tuple_(*columns), tuple_(*(literal(v) for v in key))
    after: ColumnElement[bool] = left < right if newer else left > right
    return after


def walk_order(info: WorkflowInfo, walk: str, walked: ColumnCondition | None = None) -> list[Any]:
    """The ORDER BY of a walk: `n`ewest by key, `s`cheduled by due time then key, `r`est by
    key, a `c`olumn's by that column then key, highest first."""
    keys = list(info.mapper.primary_key)
    if walk == "n":
        return [c.desc() for c in keys]
    if walk == "c" and walked is not None:
        return [info.table.c[walked.column].desc(), *(c.desc() for c in keys)]
    if walk == "s":
        return [info.table.c.wake_at, *keys]
    return keys


def walk_clauses(
    info: WorkflowInfo, walk: str, cursor: Cursor | None, walked: ColumnCondition | None = None
) -> list[ColumnElement[bool]]:
    """The rows a walk reads, after its cursor.

    The scheduled walk's `wake_at >= w` is the due index's range condition,
    a column walk's `column <= v` its index's (beside the filter's own bound);
    the tie on that value is broken by key among the few rows that hold it.
    """
    table = info.table
    clauses: list[ColumnElement[bool]] = []
    if walk == "s":
        clauses.append(table.c.next_step.isnot(None))
    if walk == "c" and walked is not None:
        clauses.append(walked.clause(info))
    if cursor is None:
        return clauses
    if walk == "s":
        at = cursor.wake_at
        clauses.append(table.c.wake_at >= at)
        clauses.append(or_(table.c.wake_at > at, _after_key(info, cursor.key, newer=False)))
    elif walk == "c" and walked is not None:
        column = table.c[walked.column]
        value = literal(cursor.value, column.type)
        clauses.append(column <= value)
        clauses.append(or_(column < value, _after_key(info, cursor.key, newer=True)))
    else:
        clauses.append(_after_key(info, cursor.key, newer=walk == "n"))
    return clauses


def walk_statement(
    info: WorkflowInfo,
    walk: str,
    where: list[ColumnElement[bool]],
    cursor: Cursor | None,
    limit: int,
    *,
    windowed: bool = False,
    offset: int = 0,
    walked: ColumnCondition | None = None,
) -> Select[Any]:
    """Up to `limit` runs of a walk that match `where`, after the cursor.

    Windowed, the walk's next SCAN_WINDOW rows are read through its index
    (newest and rest: the primary key; scheduled: the due index; a column's:
    that column's, from the filter's bound) and only those are filtered, so a
    filter few runs match costs a window, not the table.
    """
    order = walk_order(info, walk, walked)
    clauses = walk_clauses(info, walk, cursor, walked)
    if walk == "r":
        where = [*where, info.table.c.next_step.is_(None)]
    if not windowed:
        statement = select(info.cls).where(*clauses, *where).order_by(*order)
        return statement.limit(limit).offset(offset or None)
    window = (
        select(info.table).where(*clauses).order_by(*order).limit(SCAN_WINDOW).subquery("window")
    )
    scanned = aliased(info.cls, window)
    local = [_on(window, clause) for clause in where]
    return select(scanned).where(*local).order_by(*(_on(window, o) for o in order)).limit(limit)


def window_end_statement(
    info: WorkflowInfo, walk: str, cursor: Cursor | None, walked: ColumnCondition | None = None
) -> Select[Any]:
    """The last row of a walk's window (its due time or walked value, and key), if any."""
    keys = list(info.mapper.primary_key)
    lead = info.table.c[walked.column] if walk == "c" and walked is not None else None
    return (
        select(lead if lead is not None else info.table.c.wake_at, *keys)
        .where(*walk_clauses(info, walk, cursor, walked))
        .order_by(*walk_order(info, walk, walked))
        .offset(SCAN_WINDOW - 1)
        .limit(1)
    )


def _on(window: Any, expression: Any) -> Any:
    """`expression` on the table, rewritten onto the window's columns."""
    return sql_util.ClauseAdapter(window).traverse(expression)


# -- one run -------------------------------------------------------------------------------------
