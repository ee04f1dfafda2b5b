"""Addressing runs from outside: `Model.by(*where)` and what a handle can do.

A webhook or a button reaches runs through a handle: `run` a step now on
every matching row, `cancel` them where they stand, or read them with `get`
and `all`. Every write is one statement: the matching rows move together,
their version moves on (so a step running on one of them commits nothing),
and whatever is left ready is announced in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Select,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    func,
    not_,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql import Executable

from engine.base.clock import db_now
from engine.base.driver import fetch
from engine.base.errors import DulyError
from engine.base.notify import announcement
from engine.model.connection import current_connection
from engine.model.due import scheduled
from engine.model.registry import WorkflowInfo, workflow_info
from engine.model.steps import Call, Step, as_call, check_owner
from engine.runs.fanout import children_finished
from engine.runs.keys import RunKey
from engine.runs.refusals import DEDUPLICATED, MOVED_MEANWHILE, UNKNOWN_KEY, Delivery
from engine.runs.waiting import ended_announcement, wait_for_end

W = TypeVar("W")


CANCELLED = "cancelled"  # the last_error of a cancelled run


class Handle(Generic[W]):
    """The runs of one workflow that match a WHERE clause."""

    def __init__(
        self, cls: type[W], where: Sequence[ColumnElement[bool]], key: RunKey | None = None
    ) -> None:
        self._info = workflow_info(cls)
        if key is not None and key.workflow != self._info.name:
            raise DulyError(f"The key of a {key.workflow} run names no {self._info.name} run.")
        parts = len(self._info.mapper.primary_key)
        if key is not None and len(key.values) != parts:
            raise DulyError(
                f"The key of {self._info.name} has {parts} parts, not {len(key.values)}."
            )
        self._key = key  # set when the handle names one run by its whole primary key
        self._where = tuple(where) if key is None else tuple(key.where(self._info))

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
    ) -> Delivery:
        """Deliver an event to every matching run; returns what each did with it, counted.

        A run waiting for the event's step takes it now (before its deadline);
        a run on its way to a wait holds it (one at a time) until it waits;
        a finished run refuses it unless `restart`, which starts it again with
        the event. A `key` already taken by the run (its last sixteen) is
        refused. A `Delivery` counts `taken`, `held` and `refused` by reason.
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
            # A run parked on a step's former name (`@step(aliases=...)`) takes it too.
            "duly_step_names": [call.step.name, *call.step.aliases],
            "duly_event": event,
            "duly_key": key,
        }
        info = self._info
        # One statement either way. A handle made by `by_key` (the webhook's usual case: one
        # run by its primary key) reuses a statement built once per shape, keyed by value;
        # any other WHERE is built into the UPDATE itself.
        connection = current_connection()
        refused: dict[str, int] = {}
        async with connection.autocommit.connect() as conn:
            if self._key is None:
                # Built for this call anyway, so it counts the refusals by reason as it goes.
                statement = delivery_statement_where(info, restart, key is not None, self._where)
                taken, held, _, reasons = (await conn.execute(statement, params)).one()
                refused = dict(reasons or {})
            else:
                # Built once, so sent on the driver's connection (engine.base.driver): a webhook's
                # delivery costs psycopg's time, not SQLAlchemy's execution path around it.
                pinned = self._key.params()
                statement = delivery_statement(info, restart, key is not None)
                [(taken, held, _)] = await fetch(conn, statement, {**params, **pinned})
                if not taken + held:  # asked only then: an accepted delivery costs nothing more
                    why = refusal_statement(info, restart, key is not None)
                    found = (await conn.execute(why, {**params, **pinned})).one_or_none()
                    refused = {UNKNOWN_KEY if found is None else found[0] or MOVED_MEANWHILE: 1}
        if taken + held:
            connection.kick(self._info.name)
        return Delivery(taken=taken, held=held, refused=refused)

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

    async def wait(self, timeout: float | timedelta) -> W:
        """The one matching run once it has ended (finished, failed, cancelled), read then.

        Woken by the database's notification of its end; past `timeout` (seconds)
        raises `WaitTimeoutError`, whose `run` is the row as it stands. No run: `NotFoundError`.
        """
        row: W = await wait_for_end(self._info, self._where, timeout)
        return row

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
    writes is always `Type: message`, so the word alone cannot be one). Its end is
    announced to waiters in the same transaction.
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
        .returning(table.c.parent, ended_announcement(table.name).label("duly_ended"))
    )


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


@lru_cache(maxsize=256)
def delivery_statement(info: WorkflowInfo, restart: bool, keyed: bool) -> Executable:
    """One UPDATE that sorts the run with the given key into accepts, holds, or refuses.

    The key travels as one parameter per column (`duly_key_0`, ...): the text
    never changes with the call, so nothing is rendered again per delivery.
    """
    columns = info.mapper.primary_key
    named = [column == bindparam(f"duly_key_{i}") for i, column in enumerate(columns)]
    return _delivery(info, restart, keyed, and_(*named))


def delivery_statement_where(
    info: WorkflowInfo, restart: bool, keyed: bool, where: Sequence[ColumnElement[bool]]
) -> Executable:
    """The delivery of `delivery_statement` to the runs `where` matches, with refusals counted.

    Built for this call; its third column counts the refusals by reason (a
    JSON object, NULL when none refused).
    """
    return _delivery(info, restart, keyed, and_(true(), *where), count_refusals=True)


@dataclass(frozen=True)
class _Verdicts:
    """What a delivery decides for a row: it takes the event, holds it, or refuses it, why."""

    accepts: ColumnElement[bool]
    may_hold: ColumnElement[bool]
    refused: ColumnElement[str]  # the reason, NULL when the row takes or holds the event


def _verdicts(info: WorkflowInfo, restart: bool, keyed: bool) -> _Verdicts:
    t = info.table
    now = db_now()
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
    names = bindparam("duly_step_names", type_=ARRAY(Text))
    waits_here = t.c.waiting_for == any_(names)
    takes = [and_(waits_here, or_(deadline.is_(None), deadline > now))]
    ended = and_(t.c.next_step.is_(None), t.c.waiting_for.is_(None))
    if restart:
        takes.append(ended)
    # IS TRUE: a NULL (no wait, no deadline) must read as "no", not as unknown.
    accepts = and_(key_free, or_(*takes)).is_(true())
    # An event accepted but not yet taken by a worker still counts as the one held.
    untaken_event = and_(
        t.c.claimed_until.is_(None),
        t.c.next_args["event"].as_string().is_not_distinct_from("true"),
    )
    # On its way to a wait (a step scheduled or running, no wait armed): hold one event,
    # unless it accepts this one.
    may_hold = and_(
        key_free,
        t.c.waiting_for.is_(None),
        scheduled(t.c.next_step),
        t.c.pending_event.is_(None),
        not_(untaken_event),
    )
    # Why a row neither takes nor holds it, in the order a reader would look.
    deduplicated = [(not_(key_free), DEDUPLICATED)] if keyed else []
    refused = case(
        (or_(accepts, may_hold), None),
        *deduplicated,
        (and_(ended, t.c.last_error == CANCELLED), "cancelled"),
        (and_(ended, t.c.last_error.is_not(None)), "failed"),
        (ended, "finished"),
        (waits_here, "deadline_passed"),
        (t.c.waiting_for.is_not(None), "waiting_for_other_step"),
        else_="holding_another_event",
    )
    return _Verdicts(accepts, may_hold, refused)


@lru_cache(maxsize=256)
def refusal_statement(info: WorkflowInfo, restart: bool, keyed: bool) -> Executable:
    """Why the run with the given key refuses a delivery now, asked after one was refused.

    NULL when it would not refuse now; no row when no run has the key.
    """
    columns = info.mapper.primary_key
    named = [column == bindparam(f"duly_key_{i}") for i, column in enumerate(columns)]
    return select(_verdicts(info, restart, keyed).refused).where(*named)


def _delivery(
    info: WorkflowInfo,
    restart: bool,
    keyed: bool,
    rows: ColumnElement[bool],
    count_refusals: bool = False,
) -> Executable:
    t = info.table
    now = db_now()
    step_name = bindparam("duly_step", type_=Text)
    verdicts = _verdicts(info, restart, keyed)
    accepts, may_hold = verdicts.accepts, verdicts.may_hold
    # Sort the rows once, locking them (a row changed meanwhile is sorted as it now
    # stands), then write each by its sort: the verdicts are computed and spelled once,
    # which keeps the statement short enough for psycopg to cache its parsing.
    key_columns = list(info.mapper.primary_key)
    judged: list[ColumnElement[Any]] = [accepts.label("accepts"), may_hold.label("may_hold")]
    if count_refusals:
        judged.append(verdicts.refused.label("refused"))
    sorted_rows = (
        select(*key_columns, *judged).where(rows).with_for_update(key_share=True).cte("sorted")
    )
    taken: ColumnElement[bool] = sorted_rows.c.accepts
    event = cast(bindparam("duly_event", type_=JSONB), JSONB)
    moved = (
        update(t)
        .where(*(column == sorted_rows.c[column.name] for column in key_columns))
        .where(or_(taken, sorted_rows.c.may_hold))
        .values(
            next_step=case((taken, step_name), else_=t.c.next_step),
            next_args=case((taken, event), else_=t.c.next_args),
            waiting_for=case((taken, None), else_=t.c.waiting_for),
            pending_event=case(
                (taken, None),
                # The held event is the event with its step: built here, not sent twice.
                (
                    sorted_rows.c.may_hold,
                    func.jsonb_build_object("step", step_name).op("||")(event),
                ),
                else_=t.c.pending_event,
            ),
            attempts=case((taken, 0), else_=t.c.attempts),
            last_error=case((taken, None), else_=t.c.last_error),
            # A timeout step already running keeps its lease; its commit is fenced.
            wake_at=case((taken, _due_once_free(t, now)), else_=t.c.wake_at),
            wf_version=case((taken, t.c.wf_version + 1), else_=t.c.wf_version),
        )
        # RETURNING sees the new row: a run that took the event holds none, and is due
        # now unless a running step's lease still holds it.
        .returning(
            and_(t.c.pending_event.is_(None), t.c.wake_at <= now).label("ready"),
            taken.label("taken"),
        )
        .cte("moved")
    )
    ready = select(func.count()).select_from(moved).where(moved.c.ready).scalar_subquery()
    announced = case((ready > 0, announcement(t.name)), else_=None)
    # The runs that took the event, and those that hold it until they wait for it.
    took = select(func.count().filter(moved.c.taken)).select_from(moved).scalar_subquery()
    held = select(func.count().filter(~moved.c.taken)).select_from(moved).scalar_subquery()
    if not count_refusals:
        return select(took, held, announced)
    reasons = (
        select(sorted_rows.c.refused, func.count().label("runs"))
        .where(sorted_rows.c.refused.is_not(None))
        .group_by(sorted_rows.c.refused)
        .subquery("reasons")
    )
    refused = select(func.jsonb_object_agg(reasons.c.refused, reasons.c.runs)).scalar_subquery()
    return select(took, held, announced, refused)
