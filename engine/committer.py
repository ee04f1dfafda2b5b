"""The commit queue: every step that finished since the last flush commits in one statement.

Steps hand their fenced writes to the queue and wait for the answer. The
queue writes whatever has gathered while the previous flush ran, one
statement per table, so a quiet worker commits each step at once and a busy
one pays one round trip and one WAL flush for many. A flush the database
refuses (one step's value too long, say) is redone write by write, so each
step learns its own outcome; a flush that loses its connection is tried again
until the earliest lease in it would end, which the fence makes harmless.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import Row
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.bulk_commits import bulk_fenced_writes, takes
from engine.commits import Write, fenced_writes
from engine.fanout import child_finished, count_children, start_children

log = logging.getLogger("duly.worker")

TRANSIENT_ERRORS = (OperationalError, InterfaceError)  # the connection, not the data
FIRST_RECONNECT_DELAY = 0.05  # seconds
MAX_RECONNECT_DELAY = 2.0  # seconds

Pending = tuple[Write, "asyncio.Future[Row[Any] | None]"]


class Committer:
    """Batches fenced writes from concurrent steps into as few statements as possible."""

    def __init__(
        self,
        engine: AsyncEngine,
        attempt_log: type[Any] | None,
        lease: timedelta,
        transactions: AsyncEngine | None = None,
    ) -> None:
        self._engine = engine  # autocommit: one statement is one transaction
        self._transactions = transactions or engine  # for writes that touch other rows too
        self._attempt_log = attempt_log
        self._lease = lease.total_seconds()
        self._pending: list[Pending] = []
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.flushes = 0

    def start(self) -> None:
        """Begin flushing in the background."""
        self._task = asyncio.create_task(self._flush_forever())

    async def stop(self) -> None:
        """Flush what is queued, then stop."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._pending:
            await self._flush(self._take())

    async def write(self, write: Write) -> Row[Any] | None:
        """Queue `write` and wait for the row as written, or None when fenced."""
        future: asyncio.Future[Row[Any] | None] = asyncio.get_running_loop().create_future()
        self._pending.append((write, future))
        self._ready.set()
        return await future

    def _take(self) -> list[Pending]:
        taken, self._pending = self._pending, []
        self._ready.clear()
        return taken

    async def _flush_forever(self) -> None:
        while True:
            await self._ready.wait()
            await self._flush(self._take())

    async def _flush(self, batch: list[Pending]) -> None:
        # One statement per table, and per path: engine-only outcomes take the fast one.
        by_table: dict[tuple[str, bool], list[Pending]] = {}
        for pending in [p for p in batch if p[0].needs_transaction]:
            # Children to start or a parent to tell: a transaction of its own.
            try:
                await self._write_group([pending])
            except SQLAlchemyError as exc:
                _settle(pending[1], exc)
        for pending in [p for p in batch if not p[0].needs_transaction]:
            path = (pending[0].claim.info.table.fullname, takes(pending[0]))
            by_table.setdefault(path, []).append(pending)
        for group in by_table.values():
            try:
                await self._write_group(group)
            except SQLAlchemyError as exc:
                if len(group) == 1:
                    _settle(group[0][1], exc)
                    continue
                # One write spoiled the statement: find out which, each on its own.
                for single in group:
                    try:
                        await self._write_group([single])
                    except SQLAlchemyError as single_exc:
                        _settle(single[1], single_exc)
            except Exception as exc:  # a bug, not the database: the steps must hear of it
                for _, future in group:
                    _settle(future, exc)

    async def _write_with_others(self, write: Write) -> Row[Any] | None:
        """A step's outcome with the children it starts or the parent it finishes."""
        claim = write.claim
        async with self._transactions.begin() as conn:
            (row,) = await fenced_writes(conn, [write], attempt_log=self._attempt_log)
            if row is None:
                await conn.rollback()  # fenced: start no child, tell no parent
                return None
            if write.fan_out is not None:
                started = await start_children(conn, write.fan_out, claim.info, claim.key)
                await count_children(conn, claim.info, claim.key, started)
            if write.finishes_child_of is not None:
                await child_finished(conn, write.finishes_child_of, claim.info)
        return row

    async def _write_group(self, group: list[Pending]) -> None:
        deadline = time.monotonic() + self._lease
        delay = FIRST_RECONNECT_DELAY
        writes = [write for write, _ in group]
        bulk = all(takes(write) for write in writes)
        while True:
            try:
                if len(writes) == 1 and writes[0].needs_transaction:
                    rows = [await self._write_with_others(writes[0])]
                    break
                async with self._engine.connect() as conn:
                    if bulk:
                        rows = await bulk_fenced_writes(conn, writes, attempt_log=self._attempt_log)
                    else:
                        rows = await fenced_writes(conn, writes, attempt_log=self._attempt_log)
                break
            except TRANSIENT_ERRORS:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("lost the database while committing; trying again in %.2f s", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RECONNECT_DELAY)
        self.flushes += 1
        for (_, future), row in zip(group, rows, strict=True):
            if not future.done():
                future.set_result(row)


def _settle(future: asyncio.Future[Row[Any] | None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
