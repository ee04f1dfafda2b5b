"""A database that pauses (DULY_DATABASE_PAUSES): reached within a budget, released after.

Aurora Serverless v2 at 0 ACU and Neon stop their compute while no client is
connected, and the first connection after takes 15-30 s. `reach` connects within the
time an invocation has, trying again with a growing pause between tries, and logs one
line when it waited for a resume; out of time, it raises `DatabaseUnavailableError`.
`connect_options` adds `idle_session_timeout` to the connections, so a frozen container
cannot keep the database awake. Why: docs/architecture.md, "On AWS Lambda".
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("duly.lambda")

IDLE_SESSION_TIMEOUT_MS = 60_000  # the server ends a session idle this long
RETRY_AFTER_SECONDS = 30  # what a caller is told to wait: about one resume
FIRST_PAUSE = 0.25  # seconds between the first two tries; doubled after each
MOST_PAUSE = 4.0  # seconds between tries at most
MIN_CONNECT_TIMEOUT = 2  # seconds: libpq takes no less
SLOW = 1.0  # seconds: a first try longer than this (a resume it waited for) is logged
UNREACHED = (OperationalError, InterfaceError, OSError)


class DatabaseUnavailableError(ConnectionError):
    """The database did not answer within the invocation's time (it may be resuming): retry."""

    def __init__(self, waited: float, tries: int) -> None:
        super().__init__(
            f"The database did not answer within {waited:.1f} s ({tries} tries): it may be "
            f"resuming from a pause. Nothing was written; retry in {RETRY_AFTER_SECONDS} s."
        )
        self.retry_after = RETRY_AFTER_SECONDS


def connect_options(url: str) -> dict[str, Any]:
    """The `connect_args` that make the server end sessions idle past IDLE_SESSION_TIMEOUT_MS,
    after any `options` the URL carries (a keyword would replace them)."""
    given = make_url(url).query.get("options")
    given = given[-1] if isinstance(given, tuple) else given
    ours = f"-c idle_session_timeout={IDLE_SESSION_TIMEOUT_MS}"
    return {"options": f"{given} {ours}" if given else ours}


class ConnectBound:
    """Bounds each new connection's `connect_timeout` by what is left of the wait `reach` runs
    (libpq's own timeout, which closes the attempt's socket: a cancelled connect would
    leave it open, holding a server connection once the database is up)."""

    def __init__(self) -> None:
        self.deadline: float | None = None  # time.monotonic() the wait ends; None: no bound

    def install(self, engine: AsyncEngine) -> None:
        """Bound the connections `engine` makes (install it before any other `do_connect`)."""
        event.listen(engine.sync_engine, "do_connect", self._bound)

    def _bound(self, dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        if self.deadline is not None:
            left = math.ceil(self.deadline - time.monotonic())
            cparams["connect_timeout"] = max(MIN_CONNECT_TIMEOUT, left)


async def reach(engine: AsyncEngine, bound: ConnectBound, seconds: float) -> None:
    """Connect and `SELECT 1` within `seconds` (each try bounded through `bound`), trying again
    while the server does not answer; a `DatabaseUnavailableError` once the time is spent."""
    started = time.monotonic()
    pause, tries = FIRST_PAUSE, 0
    bound.deadline = started + seconds
    try:
        while True:
            tries += 1
            try:
                async with engine.connect() as conn:
                    await conn.exec_driver_sql("SELECT 1")
            except UNREACHED as error:
                last = type(error).__name__
            else:
                waited = time.monotonic() - started
                if tries > 1 or waited > SLOW:
                    log.info("The database answered after %.1f s (%d tries).", waited, tries)
                return
            # The failed try's socket is in a reference cycle (its error's traceback): collect
            # it now, or it would hold a server connection once the database is up.
            gc.collect()
            waited = time.monotonic() - started
            if seconds - waited <= pause:
                log.warning(
                    "The database did not answer in %.1f s (%d tries, last: %s).",
                    waited,
                    tries,
                    last,
                )
                raise DatabaseUnavailableError(waited, tries)
            await asyncio.sleep(pause)
            pause = min(pause * 2, MOST_PAUSE)
    finally:
        bound.deadline = None
