"""Addressing runs from outside: `Model.by(*where)` and what a handle can do.

A webhook or a button reaches runs through a handle: `run` a step now on
every matching row, `cancel` them where they stand, or read them with `get`
and `all`. Every write is one statement: the matching rows move together,
their version moves on (so a step running on one of them commits nothing),
and whatever is left ready is announced in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, Text, case, func, select, update

from engine.clock import db_now
from engine.connection import current_connection
from engine.errors import DulyError
from engine.notify import CHANNEL
from engine.steps import Call, Step, as_call, check_owner
from engine.workflow import workflow_info

W = TypeVar("W")


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
        table = self._info.table
        now = db_now()
        moved = (
            update(table)
            .where(*self._where)
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
                wake_at=case((table.c.claimed_until > now, table.c.claimed_until), else_=now),
            )
            .returning(func.coalesce(table.c.claimed_until > now, False))
            .cte("moved")
        )
        held = moved.c[0]
        # One announcement if any row is ready now; rows still leased say nothing yet.
        ready = select(func.count().filter(~held)).select_from(moved).scalar_subquery()
        statement = select(
            select(func.count()).select_from(moved).scalar_subquery(),
            case((ready > 0, func.pg_notify(CHANNEL, table.name).cast(Text)), else_=None),
        )
        connection = current_connection()
        async with connection.autocommit.connect() as conn:
            addressed, _ = (await conn.execute(statement)).one()
        connection.kick(table.name)
        return int(addressed)

    async def cancel(self) -> int:
        """End every matching run where it stands; returns how many were live.

        Nothing stays scheduled, no wait, no held event; what the run has
        done stays, and a step running now commits nothing.
        """
        table = self._info.table
        statement = (
            update(table)
            .where(*self._where)
            .where((table.c.next_step.isnot(None)) | (table.c.waiting_for.isnot(None)))
            .values(
                next_step=None,
                next_args=None,
                wake_at=None,
                claimed_until=None,
                waiting_for=None,
                pending_event=None,
                wf_version=table.c.wf_version + 1,
            )
            .returning(table.c.wf_version)
        )
        async with current_connection().autocommit.connect() as conn:
            return len((await conn.execute(statement)).all())

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

    async def _select(self, limit: int | None) -> list[W]:
        query = select(self._info.cls).where(*self._where)
        query = query.order_by(*self._info.mapper.primary_key).limit(limit)
        async with current_connection().sessionmaker() as session:
            return list((await session.scalars(query)).all())
