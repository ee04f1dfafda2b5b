"""A step's effects: what a step body writes besides its row commits with the step, or never.

Inside a step body, a registry's `publish`, a run's `start` and writes through
`step_session()` take the attempt's own transaction, begun at the first of them;
the step's fenced write commits in that transaction, so they land exactly when
it does. A body that writes none of them opens no transaction and costs nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from engine.base.errors import NotInStepError


class StepEffects:
    """The transaction a step attempt's effects share, begun only when one is written.

    A class rather than a generator: every step attempt enters one, and a
    generator-based context manager costs several times as much.
    """

    __slots__ = ("_after", "_before", "_conn", "_engine", "_idle_limit", "_lock", "_token")

    def __init__(self, engine: AsyncEngine | None, idle_limit: timedelta) -> None:
        """Effects written in `engine`; with None, the body runs outside any step's effects."""
        self._engine = engine
        self._idle_limit = idle_limit
        self._conn: AsyncConnection | None = None
        self._lock: asyncio.Lock | None = None
        self._after: list[Callable[[], None]] = []
        self._before: list[Callable[[AsyncConnection], Awaitable[None]]] = []

    def __enter__(self) -> StepEffects:
        self._token = _current.set(self if self._engine is not None else None)
        return self

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token)

    @property
    def written(self) -> bool:
        """Whether the body wrote an effect, so its commit must take their transaction."""
        return self._conn is not None

    async def connection(self) -> AsyncConnection:
        """The attempt's transaction, begun on first use (a connection: one statement at a time)."""
        if self._conn is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:  # two effects gathered at once begin one transaction
                if self._conn is None:
                    # Only a joined attempt is current, so only it is asked for a connection.
                    assert self._engine is not None
                    conn = await self._engine.connect()
                    try:
                        await conn.begin()
                        # A worker stopped mid-body (paused, frozen) must not hold the rows
                        # its effects wrote, and their unique keys, past its lease.
                        await conn.exec_driver_sql(
                            "SET LOCAL idle_in_transaction_session_timeout = "
                            f"{int(self._idle_limit.total_seconds() * 1000)}"
                        )
                    except BaseException:
                        await conn.close()
                        raise
                    self._conn = conn
        return self._conn

    def before_commit(self, statement: Callable[[AsyncConnection], Awaitable[None]]) -> None:
        """Run `statement` in the transaction just before it commits (after the step's write)."""
        self._before.append(statement)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the effects have committed (a kick of this process's workers)."""
        self._after.append(callback)

    async def commit(self) -> None:
        """Commit the effects with the step's write, then run what waited for the commit."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            for statement in self._before:
                await statement(conn)
            await conn.commit()
        finally:
            await conn.close()
        for callback in self._after:
            callback()

    async def discard(self) -> None:
        """Roll the effects back: the attempt failed, or its write was fenced."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await conn.rollback()
        except SQLAlchemyError:  # a connection already lost: PostgreSQL rolled it back itself
            await conn.invalidate()
        finally:
            await conn.close()


_current: ContextVar[StepEffects | None] = ContextVar("duly_step_effects", default=None)


def current_effects() -> StepEffects | None:
    """The effects of the step attempt running now, or None outside a step body."""
    return _current.get()


@asynccontextmanager
async def step_session(**options: Any) -> AsyncIterator[AsyncSession]:
    """A session whose writes commit with the step running now, and only if its commit wins.

        async with step_session() as session:
            session.add(Receipt(order_id=self.id))

    The session is flushed when the block ends; commit nothing yourself.
    """
    effects = current_effects()
    if effects is None:
        raise NotInStepError("step_session() is for a step body: no step attempt is running.")
    session = AsyncSession(bind=await effects.connection(), expire_on_commit=False, **options)
    try:
        yield session
        await session.flush()
    finally:
        await session.close()
