"""What an operator reads of the event layer: the outbox's summary, a page of rows, one event.

    await outbox_summary(tables)                    # counts by status, next due, per handler
    await list_outbox(tables, status="failed")      # newest first, a page at a time
    await event_detail(tables, event_id)            # the record, its outbox row, its deliveries

Read-only, and written for the HTTP app and `duly drain`. A row's status is
the stored one, except that a pending or failed row with `claimed_until`
set is `claimed`: a worker holds it (or held it: an expired lease stays
`claimed` until a worker takes the row again, which it does as soon as the
lease has ended). The queries run on the process's workflow connection
unless given an engine, each statement its own transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Text,
    and_,
    bindparam,
    case,
    cast,
    func,
    null,
    or_,
    select,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Executable

from engine.base.clock import db_now
from engine.base.errors import EventError, NotFoundError
from engine.base.shown import loads_shown
from engine.events.records import EventTables
from engine.events.statuses import CLAIMED, DEAD_LETTER, FAILED, PENDING, PROCESSED
from engine.model.connection import current_connection
from engine.model.due import due

STATEMENT_CACHE_SIZE = 64
MAX_OUTBOX_OFFSET = 100_000  # rows an offset may skip: past that, a page goes on from `before`
# What a row can be seen as: the stored statuses and the derived one.
VIEW_STATUSES = (PENDING, CLAIMED, PROCESSED, FAILED, DEAD_LETTER)
# The open statuses: what is still to do, or needs a person (the overview counts only these).
OPEN_STATUSES = (PENDING, CLAIMED, FAILED, DEAD_LETTER)
# The statuses open rows are stored with (claimed is a pending row under a live lease).
OPEN_STORED = (PENDING, FAILED, DEAD_LETTER)
RETRYABLE = (PENDING, FAILED)  # the stored statuses a claim can hold


@dataclass(frozen=True)
class HandlerCounts:
    """How many routes of one handler are failed (to retry) and dead-lettered."""

    handler: str
    failed: int
    dead_letter: int


@dataclass(frozen=True)
class OutboxSummary:
    """The outbox at a glance."""

    now: datetime  # the database's time (the moved clock included), to read next_due_at by
    counts: dict[str, int]  # every status of VIEW_STATUSES, zero when none
    next_due_at: datetime | None  # the earliest wake_at of a pending or failed row
    handlers: list[HandlerCounts]  # handlers with a failed or dead-lettered route, by name


@dataclass(frozen=True)
class OutboxRow:
    """One outbox row as an operator reads it (the event's arguments left out)."""

    event_id: str
    event_type: str
    event_name: str
    status: str  # one of VIEW_STATUSES
    route_attempts: int
    error: str | None
    created_at: datetime
    settled_at: datetime | None
    due_at: datetime | None  # when it is (next) due: a retry's time, or a claim's lease end
    claimed_until: datetime | None


@dataclass(frozen=True)
class OutboxPage:
    """A page of outbox rows, newest first, and the cursor of the next page."""

    rows: list[OutboxRow]
    next_before: str | None  # pass as `before` for the next page; None on the last


@dataclass(frozen=True)
class EventRecordView:
    """An event as published."""

    event_id: str
    event_type: str
    event_name: str
    source: str | None
    occurred_at: datetime
    payload: dict[str, Any]
    metadata: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class DeliveryView:
    """One route's result for an event."""

    route: str
    event_key: str
    handler: str
    status: str
    attempts: int
    error: str | None
    updated_at: datetime


@dataclass(frozen=True)
class EventDetail:
    """An event, its outbox row and its routes' results."""

    event: EventRecordView | None  # None only when the record was removed and the row kept
    outbox: OutboxRow | None  # None when the row was removed (cleaned up) and the record kept
    deliveries: list[DeliveryView]


@dataclass(frozen=True)
class DrainProgress:
    """What became of the events that were due when a drain started."""

    due: int  # due at the start
    routed: int  # routed out since: settled, or failed and due again later
    processed: int
    failed: int  # failed and due again later
    dead_letter: int


# -- reading ----------------------------------------------------------------------------


def engine_of(engine: AsyncEngine | None) -> AsyncEngine:
    """`engine`, or the process's workflow connection's autocommit engine."""
    return engine if engine is not None else current_connection().autocommit


async def outbox_summary(
    tables: EventTables, *, engine: AsyncEngine | None = None, open_only: bool = False
) -> OutboxSummary:
    """Counts by status, the next due instant, and the handlers with failing routes.

    `open_only` counts the open rows alone, through the status index: never
    the processed ones, which only grow (the overview's summary).
    """
    statuses = OPEN_STORED if open_only else None
    async with engine_of(engine).connect() as conn:
        totals = (await conn.execute(summary_statement(tables, statuses))).one()
        handlers = (await conn.execute(handler_counts_statement(tables))).all()
    counts = dict.fromkeys(OPEN_STATUSES if open_only else VIEW_STATUSES, 0)
    counts.update({status: int(n) for status, n in (totals.counts or {}).items()})
    return OutboxSummary(
        now=totals.now,
        counts=counts,
        next_due_at=totals.next_due_at,
        handlers=[HandlerCounts(row.handler, row.failed, row.dead_letter) for row in handlers],
    )


async def list_outbox(
    tables: EventTables,
    status: str | None = None,
    *,
    limit: int = 50,
    before: str | None = None,
    offset: int = 0,
    engine: AsyncEngine | None = None,
) -> OutboxPage:
    """Outbox rows newest first, of one status or all; after the row `before`, or skipping `offset`.

    A `before` that names no row is a NotFoundError; a bad status, limit or
    offset an EventError.
    """
    if status is not None and status not in VIEW_STATUSES:
        raise EventError(f"No outbox status {status!r}: use one of {', '.join(VIEW_STATUSES)}.")
    if limit < 1 or not 0 <= offset <= MAX_OUTBOX_OFFSET:
        raise EventError(
            f"The limit must be at least 1 and the offset from 0 to {MAX_OUTBOX_OFFSET:,}: "
            "page further on with `before`."
        )
    statement = page_statement(tables, status, before is not None)
    params = {"limit": limit, "offset": offset, "before": before}
    async with engine_of(engine).connect() as conn:
        if before is not None:
            found = await conn.execute(outbox_row_statement(tables), {"event_id": before})
            if found.first() is None:
                raise NotFoundError(f"No outbox row {before!r} to page from.")
        rows = [outbox_row(row) for row in await conn.execute(statement, params)]
    next_before = rows[-1].event_id if len(rows) == limit else None
    return OutboxPage(rows, next_before)


async def event_detail(
    tables: EventTables, event_id: str, *, engine: AsyncEngine | None = None
) -> EventDetail:
    """The event `event_id` in full; NotFoundError when neither its record nor its row exists."""
    params = {"event_id": event_id}
    async with engine_of(engine).connect() as conn:
        record = (await conn.execute(record_statement(tables), params)).first()
        row = (await conn.execute(outbox_row_statement(tables), params)).first()
        deliveries = (await conn.execute(event_deliveries_statement(tables), params)).all()
    if record is None and row is None:
        raise NotFoundError(f"No event {event_id!r}.")
    return EventDetail(
        event=None if record is None else record_view(record),
        outbox=None if row is None else outbox_row(row),
        deliveries=[DeliveryView(**delivery._asdict()) for delivery in deliveries],
    )


async def due_event_ids(
    tables: EventTables, *, engine: AsyncEngine | None = None
) -> tuple[list[str], datetime]:
    """The ids of the outbox rows due now, and the database's time of the question."""
    async with engine_of(engine).connect() as conn:
        row = (await conn.execute(due_events_statement(tables))).one()
    return list(row.ids or []), row.now


async def drain_progress(
    tables: EventTables,
    event_ids: Sequence[str],
    since: datetime,
    *,
    engine: AsyncEngine | None = None,
) -> DrainProgress:
    """What became of `event_ids` (due at `since`): routed out, and how."""
    params = {"ids": list(event_ids), "since": since}
    async with engine_of(engine).connect() as conn:
        rows = (await conn.execute(progress_statement(tables), params)).all()
    routed = {(row.status, row.routed): row.n for row in rows}

    def settled(status: str) -> int:
        return int(routed.get((status, True), 0))

    return DrainProgress(
        due=len(event_ids),
        routed=sum(n for (_, was_routed), n in routed.items() if was_routed),
        processed=settled(PROCESSED),
        failed=settled(FAILED),
        dead_letter=settled(DEAD_LETTER),
    )


def record_view(record: Any) -> EventRecordView:
    """An event record read by record_statement, its JSON nested at most SHOWN_NESTING deep."""
    given = record._asdict()
    payload, metadata = loads_shown(given.pop("payload")), loads_shown(given.pop("metadata"))
    return EventRecordView(**given, payload=payload or {}, metadata=metadata or {})


def outbox_row(row: Any) -> OutboxRow:
    """An outbox row of `outbox_columns` as an OutboxRow."""
    return OutboxRow(**row._asdict())


# -- the statements ------------------------------------------------------------------------


def view_status(outbox: Any) -> ColumnElement[str]:
    """A row's status as operators see it: `claimed` while a pending or failed row is held."""
    held = and_(outbox.c.status.in_(RETRYABLE), outbox.c.claimed_until.isnot(None))
    return case((held, CLAIMED), else_=outbox.c.status)


def status_filter(outbox: Any, status: str) -> ColumnElement[bool]:
    """The rows `view_status` calls `status`, written so the status index serves."""
    if status == CLAIMED:
        return and_(outbox.c.status.in_(RETRYABLE), outbox.c.claimed_until.isnot(None))
    if status in RETRYABLE:
        return and_(outbox.c.status == status, outbox.c.claimed_until.is_(None))
    return outbox.c.status == status  # type: ignore[no-any-return]


def outbox_columns(outbox: Any) -> list[ColumnElement[Any]]:
    """The columns of an OutboxRow, in its order."""
    return [
        outbox.c.event_id,
        outbox.c.event_type,
        outbox.c.event_name,
        view_status(outbox).label("status"),
        outbox.c.route_attempts,
        outbox.c.error,
        outbox.c.created_at,
        outbox.c.settled_at,
        case((outbox.c.next_step.isnot(None), outbox.c.wake_at), else_=null()).label("due_at"),
        outbox.c.claimed_until,
    ]


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def summary_statement(tables: EventTables, statuses: tuple[str, ...] | None = None) -> Executable:
    """One row: the database's time, the outbox's count by status, its earliest due instant.

    `statuses` keeps only rows stored with one of them (`status IN (...)`, read
    through the status index): the overview's open rows, never the processed
    ones, which only grow.
    """
    outbox = tables.outbox_table
    stored = select(
        view_status(outbox).label("status"),
        case((outbox.c.status.in_(RETRYABLE), outbox.c.wake_at), else_=null()).label("due"),
    )
    if statuses is not None:
        stored = stored.where(outbox.c.status.in_(statuses))
    rows = stored.subquery("rows")
    by_status = (
        select(rows.c.status, func.count().label("n"), func.min(rows.c.due).label("due"))
        .group_by(rows.c.status)
        .cte("by_status")
    )
    return select(
        db_now().label("now"),
        func.jsonb_object_agg(by_status.c.status, by_status.c.n).label("counts"),
        func.min(by_status.c.due).label("next_due_at"),
    ).select_from(by_status)


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def handler_counts_statement(tables: EventTables) -> Executable:
    """Per handler, its failed and its dead-lettered routes (handlers with neither left out)."""
    deliveries = tables.delivery_table
    failing = deliveries.c.status.in_((FAILED, DEAD_LETTER))
    return (
        select(
            deliveries.c.handler,
            func.count().filter(deliveries.c.status == FAILED).label("failed"),
            func.count().filter(deliveries.c.status == DEAD_LETTER).label("dead_letter"),
        )
        .where(failing)
        .group_by(deliveries.c.handler)
        .order_by(deliveries.c.handler)
    )


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def page_statement(tables: EventTables, status: str | None, after_cursor: bool) -> Executable:
    """A page of outbox rows, newest first (`status` only; older than the row :before)."""
    outbox = tables.outbox_table
    order = (outbox.c.created_at, outbox.c.event_id)
    statement = select(*outbox_columns(outbox))
    if status is not None:
        statement = statement.where(status_filter(outbox, status))
    if after_cursor:
        cursor = (
            select(*order).where(outbox.c.event_id == bindparam("before", type_=Text)).subquery()
        )
        statement = statement.where(tuple_(*order) < tuple_(*cursor.c))
    return (
        statement.order_by(*(column.desc() for column in order))
        .limit(bindparam("limit", type_=Integer))
        .offset(bindparam("offset", type_=Integer))
    )


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def outbox_row_statement(tables: EventTables) -> Executable:
    """One outbox row, as an operator reads it."""
    outbox = tables.outbox_table
    return select(*outbox_columns(outbox)).where(
        outbox.c.event_id == bindparam("event_id", type_=Text)
    )


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def record_statement(tables: EventTables) -> Executable:
    """One event record, as published."""
    records = tables.record_table
    return select(
        records.c.event_id,
        records.c.event_type,
        records.c.event_name,
        records.c.source,
        records.c.occurred_at,
        # As text, decoded by loads_shown: a value stored too deep for json.loads still reads.
        cast(records.c.payload, Text).label("payload"),
        cast(records.c.metadata, Text).label("metadata"),
        records.c.created_at,
    ).where(records.c.event_id == bindparam("event_id", type_=Text))


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def event_deliveries_statement(tables: EventTables) -> Executable:
    """The delivery attempts of one event, oldest change first."""
    deliveries = tables.delivery_table
    return (
        select(
            deliveries.c.route,
            deliveries.c.event_key,
            deliveries.c.handler,
            deliveries.c.status,
            deliveries.c.attempts,
            deliveries.c.error,
            deliveries.c.updated_at,
        )
        .where(deliveries.c.event_id == bindparam("event_id", type_=Text))
        .order_by(deliveries.c.updated_at, deliveries.c.route)
    )


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def due_events_statement(tables: EventTables) -> Executable:
    """One row: the database's time and the ids of the outbox rows due at it."""
    outbox = tables.outbox_table
    return select(db_now().label("now"), func.array_agg(outbox.c.event_id).label("ids")).where(
        due(outbox)
    )


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def progress_statement(tables: EventTables) -> Executable:
    """Of the rows :ids, due at :since, how many of each status are routed out since."""
    outbox = tables.outbox_table
    since = bindparam("since", type_=outbox.c.wake_at.type)
    routed = and_(
        outbox.c.claimed_until.is_(None),
        or_(outbox.c.next_step.is_(None), outbox.c.wake_at > since),
    )
    rows = (
        select(outbox.c.status, routed.label("routed"))
        .where(outbox.c.event_id == func.any(bindparam("ids", type_=ARRAY(Text))))
        .subquery("rows")
    )
    return select(rows.c.status, rows.c.routed, func.count().label("n")).group_by(
        rows.c.status, rows.c.routed
    )
