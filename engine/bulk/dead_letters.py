"""Replaying the outbox's dead letters a filter matches, in short batches, as runs are acted on.

A filter names an event name, a route (a dead delivery's handler or route digest) and text
within the error (the row's, or a dead delivery's), each optional. The replay of each batch
is the outbox's own `replay_statement`, the one `duly replay-dead-letters` runs.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import ColumnElement, exists, func, or_, select

from engine.base.errors import BulkChangedError, DulyError
from engine.bulk.progress import (
    BATCH_SIZE,
    AuditActor,
    BulkProgress,
    confirm_count,
    digest_of,
    hold_position,
    record_batch,
)
from engine.events.database import replay_statement
from engine.events.records import EventTables
from engine.events.statuses import DEAD_LETTER
from engine.model.connection import WorkflowConnection

ACTION = "bulk.replay"
MAX_FILTER_TEXT = 1000  # characters of a filter's text


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters: any combination, each optional."""

    event_name: str | None = None  # exactly
    route: str | None = None  # a dead delivery's handler (module.qualname) or route digest
    error: str | None = None  # text within the row's or a dead delivery's error, any case

    def subject(self) -> dict[str, Any]:
        """The filter as the audit's subject: the fields it sets."""
        return {name: value for name, value in vars(self).items() if value is not None}

    def clauses(self, tables: EventTables) -> list[ColumnElement[bool]]:
        """The WHERE clauses on the outbox; a DulyError for a text too long."""
        for name, text in self.subject().items():
            if len(text) > MAX_FILTER_TEXT:
                raise DulyError(f"The {name} filter is longer than {MAX_FILTER_TEXT} characters.")
        outbox, deliveries = tables.outbox_table, tables.delivery_table
        where: list[ColumnElement[bool]] = [outbox.c.status == DEAD_LETTER]
        if self.event_name is not None:
            where.append(outbox.c.event_name == self.event_name)
        dead = [deliveries.c.event_id == outbox.c.event_id, deliveries.c.status == DEAD_LETTER]
        if self.route is not None:
            named = or_(deliveries.c.handler == self.route, deliveries.c.route == self.route)
            where.append(exists().where(*dead, named))
        if self.error:
            in_delivery = exists().where(
                *dead, deliveries.c.error.icontains(self.error, autoescape=True)
            )
            where.append(or_(outbox.c.error.icontains(self.error, autoescape=True), in_delivery))
        return where


@dataclass(frozen=True)
class DeadLetterPlan:
    """What a dry run found: the dead letters the filter matches, and the highest event id."""

    outbox: str
    matched: int
    upto: str | None

    def to_dict(self) -> dict[str, Any]:
        """As the API answers it: `expected` and `upto` are what an apply confirms."""
        return {"outbox": self.outbox, "dry_run": True, "expected": self.matched, "upto": self.upto}


def _digest(tables: EventTables, filters: DeadLetterFilter) -> str:
    return digest_of(tables.outbox_table.name, ACTION, filters.subject())


async def plan_replay(
    connection: WorkflowConnection, tables: EventTables, filters: DeadLetterFilter
) -> DeadLetterPlan:
    """The dry run: how many dead letters match and the highest event id; writes nothing."""
    outbox = tables.outbox_table
    where = filters.clauses(tables)
    statement = select(func.count(), func.max(outbox.c.event_id)).select_from(outbox).where(*where)
    async with connection.sessionmaker() as session:
        matched, upto = (await session.execute(statement)).one()
    return DeadLetterPlan(outbox.name, int(matched), upto)


async def start_replay(
    connection: WorkflowConnection,
    tables: EventTables,
    filters: DeadLetterFilter,
    *,
    expected: int,
    upto: str | None,
) -> BulkProgress:
    """A replay's start, confirmed by the dry run's `expected` and `upto`; BulkChangedError when
    more dead letters match up to that id than the dry run counted."""
    bound = None if upto is None else (upto,)
    progress = BulkProgress.started(ACTION, expected, bound, _digest(tables, filters))
    if upto is not None:
        outbox = tables.outbox_table
        await confirm_count(
            connection,
            outbox,
            [*filters.clauses(tables), outbox.c.event_id <= upto],
            expected=expected,
            rows=f"dead letters in {outbox.name} up to {upto!r}",
        )
    return progress


def resume_replay(
    tables: EventTables, filters: DeadLetterFilter, continuation: str
) -> BulkProgress:
    """Where a replay stopped, from the `next` it answered; a DulyError for another filter."""
    progress = BulkProgress.decode(continuation, _digest(tables, filters))
    keys = (progress.upto or (), progress.after or ())
    if any(len(key) != 1 or not isinstance(key[0], str) for key in keys):
        raise BulkChangedError("This continuation is not a dead-letter replay's.")
    return progress


async def apply_replay(
    connection: WorkflowConnection,
    tables: EventTables,
    filters: DeadLetterFilter,
    progress: BulkProgress,
    actor: AuditActor,
) -> AsyncGenerator[BulkProgress]:
    """Replay the matching dead letters batch by batch from `progress`; yield after each commit.

    Each batch owns its transaction, audit record included.
    """
    outbox = tables.outbox_table
    while not progress.finished and progress.upto is not None:
        where = [*filters.clauses(tables), outbox.c.event_id <= str(progress.upto[0])]
        if progress.after is not None:
            where.append(outbox.c.event_id > str(progress.after[0]))
        async with connection.sessionmaker() as session, session.begin():
            await hold_position(session, progress, actor, action=ACTION, workflow=outbox.name)
            window = select(outbox.c.event_id).where(*where).order_by(outbox.c.event_id)
            read = list((await session.scalars(window.limit(BATCH_SIZE + 1))).all())
            seen = read[:BATCH_SIZE]
            if not seen and progress.record is None:
                progress = replace(progress, finished=True)
                yield progress
                return
            # A dead letter a drain or a replay holds locked is passed over, never waited on.
            free = (
                select(outbox.c.event_id)
                .where(outbox.c.event_id.in_(seen), outbox.c.status == DEAD_LETTER)
                .with_for_update(skip_locked=True)
            )
            ids = list((await session.scalars(free)).all())
            replayed: list[str] = []
            if ids:
                rows = await session.execute(replay_statement(tables, True), {"ids": ids})
                replayed = [row.event_id for row in rows]
            moved = await record_batch(
                session,
                progress,
                actor,
                read=len(seen),
                done=len(replayed),
                after=(seen[-1],) if seen else progress.after,
                last=len(read) <= BATCH_SIZE,
                action=ACTION,
                workflow=outbox.name,
                subject=filters.subject(),
            )
        progress = moved
        if replayed:
            connection.kick(outbox.name)
        yield progress
