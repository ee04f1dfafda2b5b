"""The process's link to the workflow database: which session factory, tables and log.

`connect_workflows(Session or app)` (and every `run_workflows`) opens the
application's connection and makes the application current in this context
(`engine.model.application`), so `row.start()`, `row.history()` and the handles
(`Model.by(...)`) find their database without being passed one. An ASGI
lifespan and the requests it serves run in different tasks: the HTTP app
makes its application current for each request.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.sql import Executable

from engine.base.errors import NotConnectedError, NotFoundError, UnsupportedTypeError
from engine.model.application import Application, current_application
from engine.model.attempt_log import attempt_log_classes
from engine.model.limits import rate_bucket_classes
from engine.model.registry import WorkflowInfo, registered_workflows, workflow_info
from engine.partitions import keep_partitions_ahead

log = logging.getLogger("duly.connection")


@dataclass
class WorkflowConnection:
    """A session factory with the workflow tables and attempt log found in its database."""

    sessionmaker: async_sessionmaker[AsyncSession]
    engine: AsyncEngine
    workflows: list[WorkflowInfo]
    attempt_log: type[Any] | None
    rate_bucket: type[Any] | None = None
    kicks: list[Callable[[str], None]] = field(default_factory=list)
    # The application this connection is of, once one was made current with it.
    application: Application | None = field(default=None, repr=False)
    # The same engine and pool, each statement its own transaction.
    autocommit: AsyncEngine = field(init=False)

    def __post_init__(self) -> None:
        self.autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")

    def kick(self, workflow: str) -> None:
        """Tell workers in this process that `workflow` has work ready (NOTIFY tells the rest)."""
        for kick in list(self.kicks):
            kick(workflow)


def current_connection() -> WorkflowConnection:
    """The connection of the application current in this context."""
    found = current_application()
    if found is None or found.connection is None:
        raise NotConnectedError()
    return found.connection


def application_for(Session: async_sessionmaker[AsyncSession] | Application) -> Application:
    """`Session`'s application: the one given, or one built on the session factory with the
    parts of the application current here (what its app module configured)."""
    if isinstance(Session, Application):
        return Session
    ambient = current_application()
    return ambient.parts_for(Session) if ambient is not None else Application(Session)


def session_engine(sessionmaker: async_sessionmaker[AsyncSession]) -> AsyncEngine:
    """The AsyncEngine a session factory is bound to."""
    bind = sessionmaker.kw.get("bind")
    if not isinstance(bind, AsyncEngine):
        raise UnsupportedTypeError(
            "The session factory must be an async_sessionmaker bound to an AsyncEngine "
            "(async_sessionmaker(create_async_engine(url)))."
        )
    return bind


async def open_connection(
    sessionmaker: async_sessionmaker[AsyncSession],
    workflows: Iterable[type[Any]] | None = None,
) -> WorkflowConnection:
    """Find which workflow tables and attempt log exist in the session factory's database."""
    engine = session_engine(sessionmaker)
    if workflows is not None:
        infos = [workflow_info(cls) for cls in workflows]
        existing = await _existing_tables(engine, {info.table.fullname for info in infos})
        missing = [info.table.fullname for info in infos if info.table.fullname not in existing]
        if missing:
            raise NotFoundError(f"Workflow tables missing from the database: {', '.join(missing)}.")
    else:
        candidates = registered_workflows()
        existing = await _existing_tables(engine, {i.table.fullname for i in candidates})
        infos = _one_per_table(i for i in candidates if i.table.fullname in existing)
    metadatas = [info.table.metadata for info in infos]
    attempt_log = await _mapped_in_database(engine, attempt_log_classes(), metadatas)
    if attempt_log is not None:  # every process of every deployment opens one
        await keep_partitions_ahead(engine, attempt_log.__table__)
    rate_bucket = await _mapped_in_database(engine, rate_bucket_classes(), metadatas)
    return WorkflowConnection(sessionmaker, engine, infos, attempt_log, rate_bucket)


@contextlib.asynccontextmanager
async def activate(
    target: Application | WorkflowConnection, workflows: Iterable[type[Any]] | None = None
) -> AsyncIterator[WorkflowConnection]:
    """Open an application's connection (unless open) and make the application current while
    the block runs; given an open connection, its application (made once, with the parts of
    the one current here)."""
    if isinstance(target, WorkflowConnection):
        if target.application is None:
            target.application = application_for(target.sessionmaker)
            target.application.connection = target
        app = target.application
    else:
        app = target
    if app.Session is None:
        raise NotConnectedError()
    opened = app.connection is None
    if opened:
        chosen = workflows if workflows is not None else app.workflows
        app.connection = await open_connection(app.Session, chosen)
        app.connection.application = app
    assert app.connection is not None
    try:
        with app.current():
            yield app.connection
    finally:
        if opened:
            app.connection = None


@contextlib.asynccontextmanager
async def connect_workflows(
    Session: async_sessionmaker[AsyncSession] | Application,
    *,
    workflows: Iterable[type[Any]] | None = None,
) -> AsyncIterator[WorkflowConnection]:
    """Address runs (start, history, ...) from a process that runs no steps."""
    async with activate(application_for(Session), workflows) as connection:
        yield connection


async def _mapped_in_database(
    engine: AsyncEngine, classes: list[type[Any]], metadatas: list[Any]
) -> type[Any] | None:
    """The class of `classes` whose table exists, preferring one on the workflows' own base."""
    ranked = sorted(classes, key=lambda c: any(c.metadata is m for m in metadatas))
    present = await _existing_tables(engine, {c.__table__.fullname for c in ranked})
    return next((c for c in reversed(ranked) if c.__table__.fullname in present), None)


async def _existing_tables(engine: AsyncEngine, names: set[str]) -> set[str]:
    if not names:
        return set()
    async with engine.connect() as conn:
        result = await conn.execute(existing_tables_statement(), {"names": sorted(names)})
        return {row.name for row in result if row.present}


def existing_tables_statement() -> Executable:
    """Which of the table names in :names exist in the database (to_regclass)."""
    return select(text("name"), text("to_regclass(name) IS NOT NULL AS present")).select_from(
        text("unnest(CAST(:names AS text[])) AS name")
    )


def _one_per_table(infos: Iterable[WorkflowInfo]) -> list[WorkflowInfo]:
    chosen: dict[str, WorkflowInfo] = {}
    for info in infos:
        if info.table.fullname in chosen:
            log.warning(
                "Two workflow classes map table %s; serving the later, %s.",
                info.table.fullname,
                info.cls.__name__,
            )
        chosen[info.table.fullname] = info
    return list(chosen.values())
