"""The worker's ear: a LISTEN connection that turns NOTIFY payloads into wake-ups.

It is an optimisation only. What a worker asked the database before sleeping
covers every timer, retry and lease, so a lost listener costs the latency of
work another process writes meanwhile, nothing else; it reconnects with a
backoff that grows to the worker's longest idle wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
from sqlalchemy.engine import URL

from engine.notify import CHANNEL, EVERYONE

log = logging.getLogger("duly.listener")

FIRST_RETRY_DELAY = 0.1  # seconds
LISTEN = f"LISTEN {CHANNEL}"  # the listener's one statement: news that work is ready


def libpq_conninfo(url: URL) -> str:
    """A libpq connection string for a SQLAlchemy URL of any PostgreSQL driver."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class Listener:
    """Holds one LISTEN connection and reports each notification's payload."""

    def __init__(self, url: URL, on_notify: Callable[[str], None], max_retry_delay: float) -> None:
        self._conninfo = libpq_conninfo(url)
        self._on_notify = on_notify
        self._max_retry_delay = max_retry_delay
        self.connected = asyncio.Event()
        self.reconnects = 0

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after any failure."""
        delay = FIRST_RETRY_DELAY
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True, application_name="duly-listener"
                ) as conn:
                    await conn.execute(LISTEN)
                    self.connected.set()
                    delay = FIRST_RETRY_DELAY
                    # Whatever was announced while we were not listening: look once.
                    self._on_notify(EVERYONE)
                    async for notification in conn.notifies():
                        self._on_notify(notification.payload)
                    raise ConnectionError("the notification stream ended")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of the connection: back off and retry
                self.connected.clear()
                self.reconnects += 1
                log.warning("listener lost its connection (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_retry_delay)
