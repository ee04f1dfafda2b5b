"""Waiting for a run to end: woken by the database's NOTIFY, polling only where none reaches.

Every statement that ends runs (a step's commit, a cancel) announces it on `ENDED_CHANNEL`
with the table's name. A process's waiters share one LISTEN connection per engine
(`EndWatch`), made when the first one waits and closed when the last one leaves; each
waiter listens first, then reads its row, so no end slips between the two. Whether
notifications reach this connection is tried once per LISTEN (a probe sent from another
connection): behind a pooler in transaction mode they do not, and the waiters read their
row every `POLL_INTERVAL` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, Engine, Text, and_, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.base.errors import DulyError, InvalidArgumentError, NotFoundError, WaitTimeoutError
from engine.base.literals import text_constant
from engine.model.connection import current_connection
from engine.model.registry import WorkflowInfo

log = logging.getLogger("duly.waiting")

ENDED_CHANNEL = "duly_ended"  # payload: the table whose runs ended
POLL_INTERVAL = 1.0  # seconds between a waiter's reads where notifications do not reach
PROBE_TIMEOUT = 1.0  # seconds a LISTEN connection has to hear its own probe
LISTEN = f"LISTEN {ENDED_CHANNEL}"


def ended(table: Any) -> ColumnElement[bool]:
    """Whether a row's run has ended (finished, failed, cancelled): nothing next, no wait."""
    return and_(table.c.next_step.is_(None), table.c.waiting_for.is_(None))


def ended_announcement(table_name: str) -> ColumnElement[str]:
    """pg_notify on the ended channel as a select-list value (NULL text); one payload a
    table, so PostgreSQL folds a transaction's many ends into one notification."""
    channel, payload = text_constant(ENDED_CHANNEL), text_constant(table_name)
    return func.pg_notify(channel, payload).cast(Text)


def wait_seconds(timeout: float | timedelta) -> float:
    """A wait's length in seconds, refused unless finite and not negative."""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgumentError(f"A wait is a number of seconds, 0 or more, not {timeout!r}.")
    return seconds


async def wait_for_end(
    info: WorkflowInfo, where: Sequence[ColumnElement[bool]], timeout: float | timedelta
) -> Any:
    """The one run `where` matches once it has ended, read then; `WaitTimeoutError` (with
    the run as it stands) past `timeout`, `NotFoundError` when no run matches."""
    deadline = time.monotonic() + wait_seconds(timeout)
    connection = current_connection()
    watch = _watch_of(connection.engine)
    query = select(info.cls).where(*where).limit(2)
    async with watch.watching(info.name, deadline) as woken:
        while True:
            woken.clear()  # before the read: an end announced after it wakes us
            async with connection.sessionmaker() as session:
                rows = list((await session.scalars(query)).all())
            if len(rows) != 1:
                if not rows:
                    raise NotFoundError(f"No {info.cls.__name__} run matches.")
                raise DulyError(f"More than one {info.cls.__name__} run matches: wait for one.")
            row = rows[0]
            if row.next_step is None and row.waiting_for is None:
                return row
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeoutError(row)
            pause = left if watch.heard else min(left, POLL_INTERVAL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), pause)


class EndWatch:
    """One LISTEN connection on `ENDED_CHANNEL`, shared by the waiters of one engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening: asyncio.Future[None] | None = None
        self.heard = False  # whether ends announced now reach this process (its probe came)

    @contextlib.asynccontextmanager
    async def watching(self, table: str, deadline: float) -> AsyncIterator[asyncio.Event]:
        """An event set whenever runs of `table` end; the block runs once LISTEN is in
        place (or failed, or not in place within `PROBE_TIMEOUT` or by `deadline`: it polls)."""
        woken = asyncio.Event()
        self._waiters.setdefault(table, set()).add(woken)
        try:
            if self._task is None:
                self._listening = asyncio.get_running_loop().create_future()
                self._task = asyncio.create_task(self._listen(self._listening))
            assert self._listening is not None
            with contextlib.suppress(TimeoutError):
                # A pool with no connection to spare delays LISTEN: the waiter polls meanwhile.
                left = min(deadline - time.monotonic(), PROBE_TIMEOUT)
                await asyncio.wait_for(asyncio.shield(self._listening), left)
            yield woken
        finally:
            self._waiters[table].discard(woken)
            if not self._waiters[table]:
                del self._waiters[table]
            if not self._waiters:
                await self._stop()

    async def _stop(self) -> None:
        task, self._task, self._listening, self.heard = self._task, None, None, False
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _listen(self, listening: asyncio.Future[None]) -> None:
        """Listen, send a probe from another connection, and wake the waiters of each table
        announced; a probe not heard in time, or a lost connection, ends it: they poll."""
        probe = f"probe {uuid.uuid4().hex}"  # no table's name: no waiter is woken by it
        try:
            async with self._engine.connect() as conn:
                try:
                    await conn.execute(text(LISTEN))
                    listening.set_result(None)
                    raw: Any = (await conn.get_raw_connection()).driver_connection
                    async with self._engine.connect() as other:
                        await other.execute(select(ended_announcement(probe)))
                    async with asyncio.timeout(PROBE_TIMEOUT) as hearing:
                        async for notification in raw.notifies():
                            if notification.payload == probe:
                                hearing.reschedule(None)
                                self.heard = True
                            for woken in self._waiters.get(notification.payload, ()):
                                woken.set()
                finally:
                    await conn.invalidate()  # never back into the pool with LISTEN on
        except TimeoutError:
            log.info("ends are not announced to this connection (a pooler?): waiters poll")
        except Exception as exc:  # the connection failed: the waiters poll from now on
            log.warning("waiting for ends without notifications (%s)", exc)
        finally:
            if not listening.done():
                listening.set_result(None)
            if self._task is asyncio.current_task():  # not stopped: its waiters poll on
                self.heard = False
                for events in self._waiters.values():
                    for woken in events:
                        woken.set()


_watches: weakref.WeakKeyDictionary[Engine, EndWatch] = weakref.WeakKeyDictionary()


def _watch_of(engine: AsyncEngine) -> EndWatch:
    """The watch of `engine` (its waiters share one LISTEN connection)."""
    found = _watches.get(engine.sync_engine)
    if found is None:
        found = _watches[engine.sync_engine] = EndWatch(engine)
    return found
