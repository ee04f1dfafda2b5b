"""Delivery attempts: what became of each route for each event, written as soon as it is known.

A route that succeeded is recorded before its drain goes on, so a drain
killed later in the same event does not run that handler again. Recording
costs one round trip per *batch*: concurrent drains hand their rows to the
log, and whoever finds no write in progress writes everything gathered (at
most the outbox's chunk size a statement) while the others wait for it. So
a quiet drain writes its row at once (after one turn of the event loop, in
which the drains finishing at the same moment join it) and a busy one shares
the statement.
"""

from __future__ import annotations

import asyncio
import hashlib
import operator
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy import Table, Text, bindparam, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Executable

from engine.events.routing import Registration, callable_identity
from engine.model.companions import (
    Companion,
    CompanionShape,
    companion_parameters,
    companion_statement,
)
from engine.model.telemetry import deliveries_recorded

STATEMENT_CACHE_SIZE = 64


@lru_cache(maxsize=4096)
def route_id(reg: Registration) -> str:
    """A registration's identity as a short stable digest (the delivery row's key).

    Kept per registration (registrations are compared by identity, and live as
    long as their registry).
    """
    return hashlib.sha256(repr(reg.identity).encode()).hexdigest()[:32]


@lru_cache(maxsize=4096)
def handler_name(reg: Registration) -> str:
    """What a person reads for a route's handler: `module.qualname`."""
    return callable_identity(reg.handler) or "?"


@dataclass(frozen=True)
class Delivery:
    """One route's result for one event, to record."""

    event_id: str
    route: str
    event_key: str
    handler: str
    status: str
    attempts: int  # handler calls this drain made
    error: str | None = None

    @classmethod
    def of(
        cls, event_id: str, reg: Registration, status: str, attempts: int, error: str | None
    ) -> Delivery:
        """The record of `reg`'s result for the event `event_id`."""
        return cls(
            event_id, route_id(reg), reg.event_key, handler_name(reg), status, attempts, error
        )


COLUMNS = ("event_id", "route", "event_key", "handler", "status", "attempts", "error")
_row_values = operator.attrgetter(*COLUMNS)  # a Delivery's values, in COLUMNS' order


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def delivery_shape(table: Table) -> CompanionShape:
    """Delivery rows as companions: upserted on (event, route), calls added, time stamped."""
    return CompanionShape(
        table,
        COLUMNS,
        conflict=("event_id", "route"),
        summed=("attempts",),
        stamped=("updated_at",),
    )


def delivery_rows(table: Table, deliveries: Sequence[Delivery]) -> Companion:
    """`deliveries` as rows of `table`, to write alone or with a step's commit."""
    rows = tuple(map(_row_values, merge(deliveries)))
    return Companion(delivery_shape(table), rows)


Pending = tuple[list[Delivery], "asyncio.Future[None]"]

_logs: weakref.WeakKeyDictionary[AsyncEngine, dict[Table, DeliveryLog]] = (
    weakref.WeakKeyDictionary()
)


def delivery_log(engine: AsyncEngine, table: Table, chunk_size: int) -> DeliveryLog:
    """The one delivery log of `table` through `engine` (autocommit) in this process.

    One per engine and table, so every drain of the process shares its statements.
    """
    logs = _logs.get(engine)
    if logs is None:
        logs = _logs[engine] = {}
    found = logs.get(table)
    if found is None:
        found = logs[table] = DeliveryLog(engine, table, chunk_size)
    return found


class DeliveryLog:
    """Records delivery attempts in shared statements, and reads an event's back."""

    def __init__(self, engine: AsyncEngine, table: Table, chunk_size: int) -> None:
        self._engine = engine  # autocommit: each statement its own transaction
        self._table = table
        self._chunk_size = max(1, chunk_size)
        self._pending: list[Pending] = []
        self._writing = False
        self.statements = 0

    async def record(self, deliveries: list[Delivery]) -> None:
        """Write `deliveries` (with whatever others are recording now); return once written."""
        if not deliveries:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((deliveries, future))
        if not self._writing:
            self._writing = True
            try:
                # One turn of the loop first: drains finishing in this same turn join in.
                await asyncio.sleep(0)
                while self._pending:
                    batch, self._pending = self._pending, []
                    await self._write(batch)
            finally:
                self._writing = False
        await future

    async def statuses(self, event_id: str) -> dict[str, str]:
        """Each recorded route of `event_id` and its status."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(statuses_statement(self._table), {"event_id": event_id})
            return {row.route: row.status for row in rows}

    async def _write(self, batch: list[Pending]) -> None:
        merged = merge([d for deliveries, _ in batch for d in deliveries])
        shape = delivery_shape(self._table)
        try:
            for start in range(0, len(merged), self._chunk_size):
                chunk = merged[start : start + self._chunk_size]
                rows = [(0, delivery_rows(self._table, chunk))]
                async with self._engine.connect() as conn:
                    await conn.execute(
                        companion_statement(shape), companion_parameters(shape, "", rows)
                    )
                self.statements += 1
                deliveries_recorded([d.status for d in chunk])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for _, future in batch:
            if not future.done():
                future.set_result(None)


def merge(deliveries: Sequence[Delivery]) -> list[Delivery]:
    """One row per (event, route), the later result winning and the calls added.

    An upsert may not touch a row twice in one statement.
    """
    if len(deliveries) < 2:
        return list(deliveries)  # a drain's usual record: one route's success
    kept: dict[tuple[str, str], Delivery] = {}
    for d in deliveries:
        key = (d.event_id, d.route)
        earlier = kept.get(key)
        if earlier is not None:
            d = Delivery(**{**vars(d), "attempts": d.attempts + earlier.attempts})
        kept[key] = d
    return list(kept.values())


@lru_cache(maxsize=STATEMENT_CACHE_SIZE)
def statuses_statement(table: Table) -> Executable:
    """The recorded routes of one event and their statuses."""
    return select(table.c.route, table.c.status).where(
        table.c.event_id == bindparam("event_id", type_=Text)
    )
