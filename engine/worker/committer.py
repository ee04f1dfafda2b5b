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
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from engine.commits.fast import fast_columns, fast_fenced_writes, takes
from engine.commits.outcomes import Write
from engine.commits.typed import fenced_writes
from engine.model.companions import companion_shapes, write_companions
from engine.model.effects import StepEffects
from engine.runs.fanout import children_finished, count_children, start_children
from engine.worker.held import HeldConnection

log = logging.getLogger("duly.worker")

TRANSIENT_ERRORS = (OperationalError, InterfaceError)  # the connection, not the data
FIRST_RECONNECT_DELAY = 0.05  # seconds
MAX_RECONNECT_DELAY = 2.0  # seconds
MAX_WRITES_PER_STATEMENT = 16  # a statement of more costs more to build than it saves
# The fast path's text does not grow with its writes (arrays carry them): a busy worker's
# commits share one statement further. Measured: the outbox at max_concurrency 100 routed
# ~7,700 events/s at 16 writes a statement, ~11,000 at 64, no more at 128 or 256.
MAX_FAST_WRITES_PER_STATEMENT = 64
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"  # the server ended a transaction left idle too long

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
        self._connection = HeldConnection(engine)  # flushes run one after another
        self._transactions = transactions or engine  # for writes that touch other rows too
        self._attempt_log = attempt_log
        self._lease = lease.total_seconds()
        self._lease_span = lease  # a step's effects may sit idle in their transaction this long
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
        await self._connection.close()

    async def release(self) -> None:
        """Give back the connection flushes keep, while nothing is queued (the worker idles)."""
        if not self._pending:
            await self._connection.close()

    def effects(self, joined: bool = True) -> StepEffects:
        """A step attempt's effects, in a transaction of this committer's database; with
        `joined` False the body's effects commit on their own, as outside a step."""
        return StepEffects(self._transactions if joined else None, self._lease_span)

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
        # One statement per table and path, at most MAX_WRITES_PER_STATEMENT writes each
        # (the typed path's statement grows with its writes, and its cost faster than its
        # length), MAX_FAST_WRITES_PER_STATEMENT on the fast path.
        # The fast path's statements are shaped by the user columns their writes change too.
        groups: dict[tuple[str, str, int, Any], list[Pending]] = {}
        for pending in batch:
            write = pending[0]
            path = _path(write)
            alone = id(write) if path == "fan-out" else 0  # a fan-out commits on its own
            shape = (
                (fast_columns(write), companion_shapes(write.companions))
                if path == "fast"
                else None
            )
            key = (write.claim.info.table.fullname, path, alone, shape)
            groups.setdefault(key, []).append(pending)
        for (_, path, _, _), group in groups.items():
            most = MAX_FAST_WRITES_PER_STATEMENT if path == "fast" else MAX_WRITES_PER_STATEMENT
            for start in range(0, len(group), most):
                await self._settle_group(path, group[start : start + most])

    async def _settle_group(self, path: str, group: list[Pending]) -> None:
        try:
            await self._write_group(path, group)
        except SQLAlchemyError as exc:
            if len(group) == 1:
                _settle(group[0][1], exc)
                return
            # One write spoiled the statement: find out which, each on its own.
            for single in group:
                try:
                    await self._write_group(path, [single])
                except SQLAlchemyError as single_exc:
                    _settle(single[1], single_exc)
        except Exception as exc:  # a bug, not the database: the steps must hear of it
            for _, future in group:
                _settle(future, exc)

    def _log_for(self, writes: list[Write]) -> type[Any] | None:
        """The attempt log for writes to one table: none for a workflow that keeps no log."""
        return self._attempt_log if writes[0].claim.info.logged else None

    async def write_with_effects(self, write: Write, effects: StepEffects) -> Row[Any] | None:
        """Commit `write` in the transaction its step's effects opened: both land, or neither.

        Not queued: the transaction is the step's own, so it commits on its own.
        """
        try:
            rows = await self._write_within(await effects.connection(), [write])
        except DBAPIError as exc:
            await effects.discard()
            if getattr(exc.orig, "sqlstate", None) != IDLE_IN_TRANSACTION_TIMEOUT:
                raise
            # The server ended the transaction the body left idle past its lease: neither
            # the effects nor the write happened, as for a fenced write.
            log.warning("a step's effects sat idle past the lease: the server rolled them back")
            return None
        except BaseException:
            await effects.discard()
            raise
        if rows[0] is None:
            await effects.discard()  # fenced: the row moved, so its effects never happened
        else:
            await effects.commit()
        return rows[0]

    async def _write_in_transaction(self, writes: list[Write]) -> list[Row[Any] | None]:
        """Outcomes with the children they start or the parents they finish, in one commit."""
        async with self._transactions.begin() as conn:
            return await self._write_within(conn, writes)

    async def _write_within(
        self, conn: AsyncConnection, writes: list[Write]
    ) -> list[Row[Any] | None]:
        """Outcomes, their companions, children and parents, in the transaction of `conn`."""
        # The outcomes themselves take the fast path when they can, as outside a transaction.
        shapes = {(fast_columns(w), companion_shapes(w.companions)) for w in writes}
        fits = len(shapes) == 1 and all(columns is not None for columns, _ in shapes)
        write_rows = fast_fenced_writes if fits else fenced_writes
        rows = await write_rows(conn, writes, attempt_log=self._log_for(writes))
        if not fits:
            # The typed path carries no companions: they follow, for the writes that landed.
            landed = [c for w, row in zip(writes, rows, strict=True) if row for c in w.companions]
            await write_companions(conn, landed)
        finished = []
        for write, row in zip(writes, rows, strict=True):
            if row is None:
                continue  # fenced: starts no child, tells no parent
            claim = write.claim
            if write.fan_out is not None:
                started = await start_children(conn, write.fan_out, claim.info, claim.key)
                await count_children(conn, claim.info, claim.key, started)
            if write.finishes_child_of is not None:
                finished.append(write.finishes_child_of)
        # Children of one parent that finished together count down in one UPDATE.
        await children_finished(conn, finished, writes[0].claim.info)
        return rows

    async def _write_group(self, path: str, group: list[Pending]) -> None:
        deadline = time.monotonic() + self._lease
        delay = FIRST_RECONNECT_DELAY
        writes = [write for write, _ in group]
        attempt_log = self._log_for(writes)
        while True:
            try:
                if path in ("fan-out", "finishing", "companions"):
                    rows = await self._write_in_transaction(writes)
                    break
                async with self._connection.connect() as conn:
                    if path == "fast":
                        rows = await fast_fenced_writes(conn, writes, attempt_log=attempt_log)
                    else:
                        rows = await fenced_writes(conn, writes, attempt_log=attempt_log)
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


def _path(write: Write) -> str:
    """How a write is committed: its own transaction, with parents, fast path, CTEs, or
    CTEs and then its companions in one transaction."""
    if write.fan_out is not None:
        return "fan-out"
    if write.finishes_child_of is not None:
        return "finishing"
    if takes(write):
        return "fast"
    return "companions" if write.companions else "typed"


def _settle(future: asyncio.Future[Row[Any] | None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
