"""Addressing runs from outside: `Model.by(*where)` and what a handle can do.

A webhook or a button reaches runs through a handle: `run` a step now on
every matching row, `cancel` them where they stand, or read them with `get`
and `all`. Every write is one statement: the matching rows move together,
their version moves on (so a step running on one of them commits nothing),
and whatever is left ready is announced in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    func,
    not_,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql import Executable

from engine.clock import db_now
from engine.connection import current_connection
from engine.due import scheduled
from engine.errors import DulyError
from engine.fanout import children_finished
from engine.notify import announcement
from engine.registry import WorkflowInfo, workflow_info
from engine.steps import Call, Step, as_call, check_owner

W = TypeVar("W")


CANCELLED = "cancelled"  # the last_error of a cancelled run


class Handle(Generic[W]):
    """The runs of one workflow that match a WHERE clause."""

    def __init__(self, cls: type[W], where: Sequence[ColumnElement[bool]]) -> None:
        self._info = workflow_info(cls)
        self._where = tuple(where)

    async def run(self, target: Step[Any, Any] | Call[Any]) -> int:
        """Run `target` now on every matching run, replacing what was scheduled.

        A step already running keeps its lease: the new step starts as soon
        as that one is done (its commit is discarded) or its lease runs out.
        A finished run starts again. Returns how many runs were addressed.
        """
        call = as_call(target)
        check_owner(call, self._info.cls)
        statement = run_statement(self._info, self._where, call)
        connection = current_connection()
        async with connection.autocommit.connect() as conn:
            addressed, _ = (await conn.execute(statement)).one()
        connection.kick(self._info.name)
        return int(addressed)

    async def deliver(
        self, target: Step[Any, Any] | Call[Any], key: str | None = None, restart: bool = False
    ) -> int:
        """Deliver an event to every matching run; returns how many accepted it.

        A run waiting for the event's step takes it (before its deadline);
        a run on its way to a wait holds it (one at a time); a finished run
        refuses it unless `restart`, which starts it again with the event. A
        `key` already taken by the run (its last sixteen) is refused.
        """
        call = as_call(target)  # the payload is checked against the step it addresses
        check_owner(call, self._info.cls)
        # "event" marks next_args as a delivered event: until a worker takes it, it counts
        # as the run's one held event.
        event = {**call.encoded, "event": True}
        if key is not None:
            event["event_key"] = key
        params: dict[str, Any] = {
            "duly_step": call.step.name,
            "duly_event": event,
            "duly_held": {"step": call.step.name, **event},
            "duly_key": key,
        }
        info = self._info
        # Find the runs first, then deliver by key with a statement built once per shape:
        # building the delivery around each caller's WHERE cost more than running it.
        connection = current_connection()
        async with connection.autocommit.connect() as conn:
            matching = matching_statement(info, self._where)
            keys = [tuple(row) for row in (await conn.execute(matching)).all()]
            if not keys:
                return 0
            statement = delivery_statement(info, restart, key is not None)
            params["duly_keys"] = keys if len(info.mapper.primary_key) > 1 else [k[0] for k in keys]
            accepted = int((await conn.execute(statement, params)).scalar_one())
        if accepted:
            connection.kick(self._info.name)
        return accepted

    async def cancel(self) -> int:
        """End every matching run where it stands; returns how many were live.

        Nothing stays scheduled, no wait, no held event; what the run has
        done stays, and a step running now commits nothing.
        """
        statement = cancel_statement(self._info, self._where)
        async with current_connection().engine.begin() as conn:
            ended = (await conn.execute(statement)).all()
            # A cancelled child counts as finished to the run that fanned it out.
            await children_finished(conn, [row.parent for row in ended if row.parent], self._info)
        return len(ended)

    async def get(self) -> W | None:
        """The one matching run, or None; more than one is an error."""
        rows = await self._select(limit=2)
        if len(rows) > 1:
            raise DulyError(
                f"More than one {self._info.cls.__name__} run matches: use all(), "
                "or narrow the condition."
            )
        return rows[0] if rows else None

    async def all(self) -> list[W]:
        """Every matching run, in primary key order."""
        return await self._select(limit=None)

    async def newest(self, limit: int) -> list[W]:
        """The `limit` matching runs with the highest primary keys, newest first."""
        return await self._select(limit=limit, newest_first=True)

    async def _select(self, limit: int | None, newest_first: bool = False) -> list[W]:
        query = select_statement(self._info, self._where, limit, newest_first)
        async with current_connection().sessionmaker() as session:
            return list((await session.scalars(query)).all())


def run_statement(
    info: WorkflowInfo, where: Sequence[ColumnElement[bool]], call: Call[Any]
) -> Executable:
    """Schedule `call` now on the matching runs; how many, and one NOTIFY if any is ready."""
    table = info.table
    now = db_now()
    moved = (
        update(table)
        .where(*where)
        .values(
            next_step=call.step.name,
            next_args=call.encoded,
            attempts=0,
            last_error=None,
            waiting_for=None,
            pending_event=None,
            # The version moves on: a step running now commits nothing.
            wf_version=table.c.wf_version + 1,
            # A running step keeps its lease, so nothing runs beside it.
            wake_at=_due_once_free(table, now),
        )
        .returning(func.coalesce(table.c.claimed_until > now, False))
        .cte("moved")
    )
    held = moved.c[0]
    # One announcement if any row is ready now; rows still leased say nothing yet.
    ready = select(func.count().filter(~held)).select_from(moved).scalar_subquery()
    return select(
        select(func.count()).select_from(moved).scalar_subquery(),
        case((ready > 0, announcement(table.name)), else_=None),
    )


def cancel_statement(info: WorkflowInfo, where: Sequence[ColumnElement[bool]]) -> Executable:
    """End the live matching runs where they stand; each one's parent, to count down.

    A cancelled run says so: `last_error` is `CANCELLED` (an error the engine
    writes is always `Type: message`, so the word alone cannot be one).
    """
    table = info.table
    return (
        update(table)
        .where(*where)
        .where(scheduled(table.c.next_step) | table.c.waiting_for.isnot(None))
        .values(
            next_step=None,
            next_args=None,
            wake_at=None,
            claimed_until=None,
            waiting_for=None,
            pending_event=None,
            attempts=0,
            last_error=CANCELLED,
            wf_version=table.c.wf_version + 1,
        )
        .returning(table.c.parent)
    )


def matching_statement(info: WorkflowInfo, where: Sequence[ColumnElement[bool]]) -> Executable:
    """The primary keys of the matching runs, for a delivery built once per shape."""
    return select(*info.mapper.primary_key).where(*where)


def select_statement(
    info: WorkflowInfo,
    where: Sequence[ColumnElement[bool]],
    limit: int | None,
    newest_first: bool = False,
) -> Select[Any]:
    """The matching runs as instances, by primary key (the newest first, if asked)."""
    key = info.mapper.primary_key
    order = [column.desc() for column in key] if newest_first else key
    return select(info.cls).where(*where).order_by(*order).limit(limit)


def _due_once_free(table: Any, now: Any) -> Any:
    """Due now, or when the lease of a step still running on the row ends."""
    return case((table.c.claimed_until > now, table.c.claimed_until), else_=now)


def _among(info: WorkflowInfo, keys: Any) -> ColumnElement[bool]:
    """The rows whose primary key is in `keys` (an expanding parameter)."""
    columns = list(info.mapper.primary_key)
    return columns[0].in_(keys) if len(columns) == 1 else tuple_(*columns).in_(keys)


@lru_cache(maxsize=256)
def delivery_statement(info: WorkflowInfo, restart: bool, keyed: bool) -> Executable:
    """One UPDATE that sorts the runs with the given keys into accepts, holds, or refuses."""
    t = info.table
    now = db_now()
    step_name = bindparam("duly_step", type_=Text)
    key = bindparam("duly_key", type_=Text)
    deadline = cast(t.c.next_args["deadline"].as_string(), DateTime(timezone=True))
    key_free: ColumnElement[bool] = true()
    if keyed:
        key_free = not_(
            or_(
                func.coalesce(cast(t.c.recent_event_keys, JSONB).op("?")(key), False),
                # An accepted event not yet run, or the one held, carries its key too.
                t.c.next_args["event_key"].as_string().is_not_distinct_from(key),
                t.c.pending_event["event_key"].as_string().is_not_distinct_from(key),
            )
        )
    # Waiting for this step, and the deadline (judged now, as the delivery reaches the
    # row) not passed; or finished, and told to start again.
    takes = [and_(t.c.waiting_for == step_name, or_(deadline.is_(None), deadline > now))]
    if restart:
        takes.append(and_(t.c.next_step.is_(None), t.c.waiting_for.is_(None)))
    # IS TRUE: a NULL (no wait, no deadline) must read as "no", not as unknown.
    accepts = and_(key_free, or_(*takes)).is_(true())
    # An event accepted but not yet taken by a worker still counts as the one held.
    untaken_event = and_(
        t.c.claimed_until.is_(None),
        t.c.next_args["event"].as_string().is_not_distinct_from("true"),
    )
    # On its way to a wait (a step scheduled or running, no wait armed): hold one event.
    holds = and_(
        key_free,
        not_(accepts),
        t.c.waiting_for.is_(None),
        scheduled(t.c.next_step),
        t.c.pending_event.is_(None),
        not_(untaken_event),
    )
    event = cast(bindparam("duly_event", type_=JSONB), JSONB)
    moved = (
        update(t)
        .where(_among(info, bindparam("duly_keys", expanding=True)))
        .where(or_(accepts, holds))
        .values(
            next_step=case((accepts, step_name), else_=t.c.next_step),
            next_args=case((accepts, event), else_=t.c.next_args),
            waiting_for=case((accepts, None), else_=t.c.waiting_for),
            pending_event=case(
                (accepts, None),
                (holds, cast(bindparam("duly_held", type_=JSONB), JSONB)),
                else_=t.c.pending_event,
            ),
            attempts=case((accepts, 0), else_=t.c.attempts),
            last_error=case((accepts, None), else_=t.c.last_error),
            # A timeout step already running keeps its lease; its commit is fenced.
            wake_at=case(
                (accepts, _due_once_free(t, now)),
                else_=t.c.wake_at,
            ),
            wf_version=case((accepts, t.c.wf_version + 1), else_=t.c.wf_version),
        )
        # RETURNING sees the new row: a run that took the event holds none, and is due
        # now unless a running step's lease still holds it.
        .returning(and_(t.c.pending_event.is_(None), t.c.wake_at <= now).label("ready"))
        .cte("moved")
    )
    ready = select(func.count()).select_from(moved).where(moved.c.ready).scalar_subquery()
    announced = case((ready > 0, announcement(t.name)), else_=None)
    return select(select(func.count()).select_from(moved).scalar_subquery(), announced)
