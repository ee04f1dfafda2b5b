"""Running a worker for the length of a block, and asking the running one to look.

`run_workflows` is how an application or a Lambda entry serves its workflows;
`wake` is how the platform's caller asks that worker whether it is caught up.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine.base.errors import ConfigurationError, NotRunningError
from engine.model.application import Application, current_application
from engine.model.connection import activate, application_for
from engine.model.steps import DEFAULT_LANE
from engine.worker.idle import OnIdle
from engine.worker.loop import Worker
from engine.worker.options import (
    IDLE_INTERVAL,
    LEASE,
    MAX_CONCURRENCY,
    POLL_INTERVAL,
    SHUTDOWN_TIMEOUT,
    SUSPENDING_IDLE_INTERVAL,
    WorkerOptions,
)


@contextlib.asynccontextmanager
async def run_workflows(
    Session: async_sessionmaker[AsyncSession] | Application,
    *,
    max_concurrency: int = MAX_CONCURRENCY,
    lease: timedelta = LEASE,
    poll_interval: timedelta = POLL_INTERVAL,
    max_idle_interval: timedelta | None = None,
    shutdown_timeout: timedelta = SHUTDOWN_TIMEOUT,
    on_idle: OnIdle | None = None,
    suspends_when_idle: bool = False,
    listen_engine: AsyncEngine | None = None,
    lanes: Iterable[str] = (DEFAULT_LANE,),
    workflows: Iterable[type[Any]] | None = None,
) -> AsyncIterator[Worker]:
    """Run a worker for the workflows in Session's database while the block runs.

    `max_idle_interval` defaults to 30 seconds, or an hour with
    `suspends_when_idle` (which also means: no LISTEN connection).
    """
    if suspends_when_idle and listen_engine is not None:
        raise ConfigurationError(
            "Pass suspends_when_idle or listen_engine, not both: a worker on a database that "
            "suspends itself must not hold a LISTEN connection, which listen_engine asks for."
        )
    if max_idle_interval is None:
        max_idle_interval = SUSPENDING_IDLE_INTERVAL if suspends_when_idle else IDLE_INTERVAL
    app = application_for(Session)
    options = WorkerOptions(
        max_concurrency=max_concurrency,
        lease=lease,
        poll_interval=poll_interval,
        max_idle_interval=max_idle_interval,
        shutdown_timeout=shutdown_timeout,
        listen=not suspends_when_idle,
        on_idle=on_idle if on_idle is not None else app.on_idle,
        listen_engine=listen_engine,
        lanes=frozenset([lanes] if isinstance(lanes, str) else lanes),
    )
    async with activate(app, workflows) as connection:
        worker = Worker(connection, options)
        connection.kicks.append(worker.kick)
        app.workers.append(worker)
        await worker.start()
        try:
            yield worker
        finally:
            app.workers.remove(worker)
            connection.kicks.remove(worker.kick)
            await worker.stop()


async def wake(timeout: timedelta | float) -> bool:
    """Ask the current application's worker to look; True once it is caught up and has told
    on_idle.

    False when `timeout` passes first, or at once when eight callers are
    already waiting (the worker is asked to look all the same).
    """
    app = current_application()
    if app is None or not app.workers:
        raise NotRunningError()
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    worker: Worker = app.workers[-1]
    return await worker.wake(seconds)
