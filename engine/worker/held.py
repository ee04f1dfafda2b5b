"""A connection kept checked out by one loop that runs its statements one after another.

The worker's pass loop and its commit queue each keep one connection instead of checking
one out of SQLAlchemy's pool per statement, whose bookkeeping costs more than a no-op
step's share of the statement. It is dropped whenever a block raises anything but the
database refusing a statement, so a broken connection is never used twice; every
statement through it is its own transaction (an autocommit engine).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


class HeldConnection:
    """One connection of `engine`, kept between uses by a single sequential user."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._conn: AsyncConnection | None = None
        self._using = False

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """The kept connection (opened if there is none); dropped if the block raises."""
        conn = self._conn
        if conn is None or conn.closed or conn.invalidated:
            conn = self._conn = await self._engine.connect()
        self._using = True
        try:
            yield conn
        except DBAPIError as exc:
            lost = exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)
            if lost:
                await self._drop(conn)
            raise
        except BaseException:
            await self._drop(conn)
            raise
        finally:
            self._using = False

    async def close(self) -> None:
        """Give the kept connection back to the pool, unless a block is using it now.

        The loop is done with it, or will not need it for a while: an idle
        worker holds no connection of its own, as before it kept one.
        """
        conn = self._conn
        if conn is not None and not self._using:
            self._conn = None
            await conn.close()  # healthy: back to the pool

    async def _drop(self, conn: AsyncConnection) -> None:
        if self._conn is conn:
            self._conn = None
        # A connection whose statement was interrupted may be mid-protocol: never reuse it.
        with contextlib.suppress(Exception):
            await conn.invalidate()
        with contextlib.suppress(Exception):
            await conn.close()
