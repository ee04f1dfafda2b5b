"""The database registry: events published into the outbox, in the caller's own transaction.

    await registry.publish(event, session=session)   # written with the business change
    await session.commit()                           # ...and announced when it commits

An event and its outbox row are one statement (`queue_events`' CTEs; one for a whole batch),
so an event is published exactly when the transaction that made it commits. The outbox row is
due work of the engine's own (`engine.events.outbox`); `publish_sync` commits it in hand and
routes it inline; `replay_dead_letters` makes dead letters due again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import lru_cache, partial
from typing import Any

from sqlalchemy import (
    CTE,
    Connection,
    DateTime,
    Float,
    Text,
    bindparam,
    case,
    cast,
    func,
    null,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.sql import ColumnElement, Executable

from engine.base.clock import db_now
from engine.base.errors import ConfigurationError, EventError
from engine.base.literals import SECOND, int_constant, text_constant
from engine.base.notify import announcement
from engine.events.deliveries import DeliveryLog, delivery_log
from engine.events.draining import Verdict, drain_event
from engine.events.event import WorkflowEvent
from engine.events.records import EventTables, OutboxColumns, outbox_tables_of, tables_for
from engine.events.routing import RoutedRegistry
from engine.events.settings import EventSettings
from engine.events.statuses import DEAD_LETTER, FAILED, PENDING
from engine.model.companions import array_parameter
from engine.model.connection import current_connection
from engine.model.effects import current_effects
from engine.model.telemetry import duplicates_ignored

log = logging.getLogger("duly.events")

ROUTE_STEP = "route"  # the outbox's one step (WorkflowOutbox.route)
STATEMENT_CACHE_SIZE = 64
# An event's columns, as the arrays one publish statement takes (JSON as text).
EVENT_FIELDS: tuple[tuple[str, Any], ...] = (
    ("event_id", Text),
    ("event_type", Text),
    ("event_name", Text),
    ("source", Text),
    ("occurred_at", DateTime(timezone=True)),
    ("payload", Text),
    ("metadata", Text),
)

Transaction = AsyncSession | AsyncConnection


class DatabaseEventRegistry(RoutedRegistry):
    """Publishes into the outbox; drains route with this process's registrations."""

    def __init__(
        self, *, outbox: type[Any] | None = None, settings: EventSettings | None = None
    ) -> None:
        super().__init__()
        self.settings = settings if settings is not None else EventSettings.from_env()
        self._outbox = outbox

    def tables(self) -> EventTables:
        """The event tables this registry writes: its outbox's, or the connection's."""
        if self._outbox is not None:
            return tables_for(self._outbox)
        outboxes = [
            info.cls
            for info in current_connection().workflows
            if issubclass(info.cls, OutboxColumns)
        ]
        if len(outboxes) > 1:
            names = ", ".join(getattr(cls, "__tablename__", cls.__name__) for cls in outboxes)
            raise ConfigurationError(
                f"The workflow database maps more than one outbox ({names}): give the "
                "DatabaseEventRegistry the one it publishes into (outbox=...)."
            )
        tables = outbox_tables_of(outboxes)
        if tables is None:
            raise ConfigurationError(
                "No outbox table in the workflow database: map WorkflowOutbox, "
                "WorkflowEventRecord and WorkflowDeliveryAttempt on your base and create them."
            )
        return tables

    def deliveries(self, engine: AsyncEngine) -> DeliveryLog:
        """The delivery log of this registry's tables, writing through `engine`."""
        table = self.tables().delivery_table
        return delivery_log(engine, table, self.settings.outbox_process_chunk_size)

    async def publish(self, event: WorkflowEvent, *, session: Transaction | None = None) -> bool:
        """Store `event` in the outbox (in `session`'s transaction when given); False.

        With DULY_ASYNC off and no session, it routes inline (`publish_sync`).
        """
        if session is None and not self.settings.async_delivery and current_effects() is None:
            return await self.publish_sync(event)
        await self.publish_many([event], session=session)
        return False

    async def publish_many(
        self, events: Iterable[WorkflowEvent], *, session: Transaction | None = None
    ) -> list[str]:
        """Store `events` in one statement; the ids newly stored (duplicates left out)."""
        tables = self.tables()
        statement, params = self._publish(tables, list(events), in_hand=False)
        if params is None:
            return []
        effects = current_effects() if session is None else None
        if session is not None:
            rows = (await session.execute(statement, params)).all()
        elif effects is not None:  # in a step body: they commit with the step, or never
            rows = (await (await effects.connection()).execute(statement, params)).all()
        else:
            async with current_connection().autocommit.connect() as conn:
                rows = (await conn.execute(statement, params)).all()
        stored = [row.event_id for row in rows]
        duplicates_ignored("database", len(params["event_id"]) - len(stored))
        if stored and session is None:
            kick = partial(current_connection().kick, tables.outbox_table.name)
            if effects is not None:
                effects.after_commit(kick)
            else:
                kick()
        return stored

    def publish_in(self, connection: Connection, events: Sequence[WorkflowEvent]) -> list[str]:
        """Store `events` through a synchronous connection's transaction (a flush's, say)."""
        statement, params = self._publish(self.tables(), list(events), in_hand=False)
        if params is None:
            return []
        stored = [row.event_id for row in connection.execute(statement, params)]
        duplicates_ignored("database", len(params["event_id"]) - len(stored))
        return stored

    async def publish_sync(self, event: WorkflowEvent) -> bool:
        """Commit `event`, then route it now; True when a handler completed for it in this call.

        In a step body it is stored with the step's commit instead, and routed by a drain.
        """
        if current_effects() is not None:
            await self.publish_many([event])
            return False
        tables = self.tables()
        statement, params = self._publish(tables, [event], in_hand=True)
        connection = current_connection()
        async with connection.autocommit.connect() as conn:
            stored = (await conn.execute(statement, params)).first() is not None
        if not stored:
            duplicates_ignored("database")
        routes = self.routes.matching(event)
        verdict = await drain_event(
            event,
            routes,
            self.settings,
            self.deliveries(connection.autocommit),
            route_attempts=0,
            first_drain=stored,
        )
        await self.deliveries(connection.autocommit).record(list(verdict.deliveries))
        if stored:
            async with connection.autocommit.connect() as conn:
                await conn.execute(settle_statement(tables), settle_params(event, verdict))
        return verdict.completed_now

    async def replay_dead_letters(self, event_ids: Iterable[str] | None = None) -> list[str]:
        """Make dead-lettered events due again (all, or those of `event_ids`); their ids."""
        ids = None if event_ids is None else list(event_ids)
        connection = current_connection()
        tables = self.tables()
        async with connection.autocommit.connect() as conn:
            rows = (
                await conn.execute(replay_statement(tables, ids is not None), {"ids": ids})
            ).all()
        replayed = [row.event_id for row in rows]
        if replayed:
            connection.kick(tables.outbox_table.name)
        return replayed

    def _publish(
        self,
        tables: EventTables,
        events: list[WorkflowEvent],
        *,
        in_hand: bool,
    ) -> tuple[Executable, dict[str, Any] | None]:
        statement = publish_statement(tables, in_hand)
        if not events:
            return statement, None
        params: dict[str, list[Any]] = {name: [] for name, _ in EVENT_FIELDS}
        for event in events:
            for name, value in event_values(event).items():
                params[name].append(value)
        if in_hand:
            return statement, {**params, "lease": self.settings.outbox_claim_ttl_seconds}
        return statement, params


def event_values(event: WorkflowEvent) -> dict[str, Any]:
    """An event's columns as the publish statement takes them; EventError when it cannot be."""
    if not isinstance(event, WorkflowEvent):
        raise EventError(f"Only a WorkflowEvent can be published, not {type(event).__name__}.")
    if not isinstance(event.occurred_at, datetime) or event.occurred_at.tzinfo is None:
        raise EventError(f"Event {event.event_id}: occurred_at must be an aware datetime.")
    encoded = {}
    for name in ("payload", "metadata"):
        try:
            encoded[name] = json.dumps(dict(getattr(event, name)))
        except (TypeError, ValueError) as exc:
            raise EventError(f"Event {event.event_id}: its {name} is not JSON: {exc}.") from exc
    return {
        "event_id": str(event.event_id),
        "event_type": event.event_type,
        "event_name": event.event_name,
        "source": event.source,
        "occurred_at": event.occurred_at,
        **encoded,
    }


def event_json(record: Any) -> ColumnElement[Any]:
    """An event record's columns as the JSON object the outbox's step takes."""
    return func.jsonb_build_object(
        text_constant("event_id"), record.event_id,
        text_constant("event_type"), record.event_type,
        text_constant("event_name"), record.event_name,
        text_constant("source"), record.source,
        text_constant("occurred_at"), record.occurred_at,
        text_constant("payload"), record.payload,
        text_constant("metadata"), record.metadata,
    )  # fmt: skip


def route_arguments(record: Any) -> ColumnElement[Any]:
    """The outbox step's arguments (as `Call.encoded` spells them) for an event record."""
    event = func.jsonb_build_object(text_constant("event"), event_json(record))
    return func.jsonb_build_object(text_constant("kwargs"), event)


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def publish_statement(tables: EventTables, in_hand: bool) -> Executable:
    """Store events and queue their outbox rows from arrays: one statement for a batch.

    Records that already exist (a duplicate id) are skipped, and so are
    their outbox rows; only the rows queued are announced. `in_hand` queues them leased
    for :lease seconds instead of due now (publish_sync), unannounced.
    """
    arrays = [array_parameter(name, type_) for name, type_ in EVENT_FIELDS]
    given = func.unnest(*arrays).table_valued(*(name for name, _ in EVENT_FIELDS))
    queued = queue_events(tables, given.render_derived(name="given", with_types=False), in_hand)
    if in_hand:
        return select(queued.c.event_id)
    announced = announcement(tables.outbox_table.name).label("duly_notified")
    return select(queued.c.event_id, announced)


def queue_events(tables: EventTables, given: Any, in_hand: bool = False) -> CTE:
    """The CTEs that store the events of `given` and queue their outbox rows: `queued`,
    whose rows are the ids of the events queued (a duplicate id is skipped).

    `given` is any FROM with the columns of EVENT_FIELDS, payload and metadata
    as JSON text: the arrays of `publish_statement`, or the rows of a larger
    statement that publishes its events itself (a graph move's write).
    """
    records, outbox = tables.record_table, tables.outbox_table
    c = given.c
    # Both rows' created_at are the database's time (its column default is not shifted).
    now = db_now()
    stored = (
        insert(records)
        .from_select(
            [
                "event_id",
                "event_type",
                "event_name",
                "source",
                "occurred_at",
                "payload",
                "metadata",
                "created_at",
            ],
            select(
                c.event_id,
                c.event_type,
                c.event_name,
                c.source,
                c.occurred_at,
                cast(c.payload, JSONB),
                cast(c.metadata, JSONB),
                now,
            ),
        )
        .on_conflict_do_nothing(index_elements=[records.c.event_id])
        .returning(*records.c)
        .cte("stored")
    )
    # A row in hand is leased to its publisher: due (to a drain) only once the lease ends.
    until = now + SECOND * bindparam("lease", type_=Float)
    return (
        insert(outbox)
        .from_select(
            [
                "event_id",
                "event_type",
                "event_name",
                "status",
                "route_attempts",
                "next_step",
                "next_args",
                "wake_at",
                "claimed_until",
                "attempts",
                "wf_version",
                "created_at",
            ],
            select(
                stored.c.event_id,
                stored.c.event_type,
                stored.c.event_name,
                text_constant(PENDING),
                int_constant(0),
                text_constant(ROUTE_STEP),
                route_arguments(stored.c),
                until if in_hand else now,
                until if in_hand else null(),
                int_constant(0),
                # A row in hand is as if claimed once: a drain that takes it over reads its
                # deliveries (see WorkflowOutbox.route).
                int_constant(1 if in_hand else 0),
                stored.c.created_at,
            ),
        )
        .on_conflict_do_nothing()
        .returning(outbox.c.event_id)
        .cte("queued")
    )


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def settle_statement(tables: EventTables) -> Executable:
    """What `publish_sync` writes once it has routed its row in hand, fenced on that hand.

    A failed row goes back to its step, due after the backoff; any other is settled.
    """
    outbox = tables.outbox_table
    failed = bindparam("new_status", type_=Text) == FAILED
    now = db_now()
    retry_at = now + func.make_interval(0, 0, 0, 0, 0, 0, bindparam("new_retry_in", type_=Float))
    return (
        update(outbox)
        .where(outbox.c.event_id == bindparam("new_event_id", type_=Text))
        .where(outbox.c.wf_version == 1)
        .values(
            status=bindparam("new_status", type_=Text),
            route_attempts=bindparam("new_route_attempts"),
            error=bindparam("new_error", type_=Text),
            settled_at=now,
            next_step=case((failed, outbox.c.next_step), else_=None),
            next_args=case((failed, outbox.c.next_args), else_=None),
            wake_at=case((failed, retry_at), else_=None),
            claimed_until=None,
            wf_version=outbox.c.wf_version + 1,
        )
    )


def settle_params(event: WorkflowEvent, verdict: Verdict) -> dict[str, Any]:
    """The parameters of `settle_statement` for `verdict`."""
    retry_in = verdict.retry_in.total_seconds() if verdict.retry_in is not None else 0.0
    return {
        "new_event_id": event.event_id,
        "new_status": verdict.status,
        "new_route_attempts": verdict.route_attempts,
        "new_error": verdict.error,
        "new_retry_in": retry_in,
    }


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def replay_statement(tables: EventTables, chosen: bool) -> Executable:
    """Dead-lettered outbox rows due again from their event records, their dead routes failed.

    `chosen`: only the rows whose ids are in :ids. A row that is not dead
    (replayed already, or never dead) is left alone.
    """
    records, outbox, deliveries = tables.record_table, tables.outbox_table, tables.delivery_table
    now = db_now()
    where = [outbox.c.status == DEAD_LETTER, records.c.event_id == outbox.c.event_id]
    if chosen:
        where.append(outbox.c.event_id == func.any(bindparam("ids", type_=ARRAY(Text))))
    replayed = (
        update(outbox)
        .where(*where)
        .values(
            status=PENDING,
            route_attempts=0,
            error=None,
            settled_at=None,
            next_step=ROUTE_STEP,
            next_args=route_arguments(records.c),
            wake_at=now,
            attempts=0,
            last_error=None,
            claimed_until=None,
            wf_version=outbox.c.wf_version + 1,
        )
        .returning(outbox.c.event_id)
        .cte("replayed")
    )
    revived = (
        update(deliveries)
        .where(deliveries.c.status == DEAD_LETTER)
        .where(deliveries.c.event_id.in_(select(replayed.c.event_id)))
        .values(status=FAILED, updated_at=now)
        .returning(deliveries.c.event_id)
        .cte("revived")
    )
    return select(replayed.c.event_id, announcement(outbox.name).label("duly_notified")).add_cte(
        revived
    )
