"""The worker's ear: a LISTEN connection that turns NOTIFY payloads into wake-ups.

It is an optimisation only: a lost listener costs the latency of work another process
writes meanwhile, and it reconnects with a backoff growing to the worker's longest idle
wait. Its connection comes from a SQLAlchemy engine (the worker's, or its `listen_engine`),
so that engine's `connect_args` and `do_connect` hooks apply; it is thrown away afterwards,
never returned to the pool with LISTEN on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.base.notify import CHANNEL, EVERYONE

log = logging.getLogger("duly.listener")

FIRST_RETRY_DELAY = 0.1  # seconds
LISTEN = f"LISTEN {CHANNEL}"  # the listener's one statement: news that work is ready


class Listener:
    """Holds one LISTEN connection and reports each notification's payload."""

    def __init__(
        self, engine: AsyncEngine, on_notify: Callable[[str], None], max_retry_delay: float
    ) -> None:
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._on_notify = on_notify
        self._max_retry_delay = max_retry_delay
        self.connected = asyncio.Event()
        self.reconnects = 0

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after any failure."""
        delay = FIRST_RETRY_DELAY
        while True:
            try:
                async with self._engine.connect() as conn:
                    try:
                        await self._listen(conn)
                    finally:
                        # Never back into the pool with LISTEN on: the next user would
                        # receive our notifications.
                        await conn.invalidate()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of the connection: back off and retry
                if self.connected.is_set():
                    delay = FIRST_RETRY_DELAY  # it had been listening: start the backoff over
                self.connected.clear()
                self.reconnects += 1
                log.warning("listener lost its connection (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_retry_delay)

    async def _listen(self, conn: Any) -> None:
        named = (await conn.execute(text("SELECT current_setting('application_name')"))).scalar()
        if not named:
            await conn.execute(text("SET application_name = 'duly-listener'"))
        await conn.execute(text(LISTEN))
        raw = (await conn.get_raw_connection()).driver_connection  # psycopg's own connection
        self.connected.set()
        # Whatever was announced while we were not listening: look once.
        self._on_notify(EVERYONE)
        async for notification in raw.notifies():
            self._on_notify(notification.payload)
        raise ConnectionError("the notification stream ended")
