"""The application: one database's duly state in a process, found through a context variable.

An `Application` holds what used to be the process's: its session factory and
connection, its event registry, graph runtime, timers' escalations, durable
engines and running workers. The current one is a `ContextVar`, so tasks
started under it (a worker's, a request's) find it, and two applications on
two databases live side by side. Why: docs/architecture.md, "The application object".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine.base.errors import NotConnectedError

if TYPE_CHECKING:
    from engine.model.connection import WorkflowConnection

_current: ContextVar[Application | None] = ContextVar("duly_application", default=None)


class Application:
    """One database's duly state: its parts (registry, graph runtime, hooks) and connection."""

    def __init__(
        self,
        Session: async_sessionmaker[AsyncSession] | None = None,
        *,
        workflows: Iterable[type[Any]] | None = None,
        event_registry: Any = None,
        graph_runtime: Any = None,
        workflow_engine: Any = None,
        on_idle: Any = None,
        kick: Callable[[str], None] | None = None,
    ) -> None:
        self.Session = Session
        self.workflows = tuple(workflows) if workflows is not None else None
        self.event_registry = event_registry  # an EventRegistry (engine.events)
        self.event_settings: Any = None  # the environment's EventSettings, read once
        self.workflow_engine = workflow_engine  # a WorkflowEngine (engine.executions)
        self.durable_engines: list[Any] = []  # DurableWorkflowEngines that registered
        self.escalations: dict[str, Callable[..., Any]] = {}  # timer table -> escalate
        self.workers: list[Any] = []  # the Workers running for this application
        self.on_idle = on_idle
        self.kick_hook = kick
        self.connection: WorkflowConnection | None = None
        self.graph_runtime: Any = None
        if graph_runtime is not None:
            self.use_graph_runtime(graph_runtime)

    def use_graph_runtime(self, runtime: Any) -> Any:
        """Make `runtime` this application's graph runtime; its timers escalate through it."""
        self.graph_runtime = runtime
        timer = runtime.tables.timer
        if timer is not None:
            self.escalations[timer.__table__.name] = runtime.escalate
        return runtime

    def parts_for(
        self, Session: async_sessionmaker[AsyncSession], kind: type[Application] | None = None
    ) -> Application:
        """A new application (of `kind`, else this one's class) on `Session` with this one's
        parts (registry, runtime, hooks)."""
        made = (kind or type(self))(
            Session,
            workflows=self.workflows,
            event_registry=self.event_registry,
            workflow_engine=self.workflow_engine,
            on_idle=self.on_idle,
            kick=self.kick_hook,
        )
        made.graph_runtime = self.graph_runtime
        made.escalations = dict(self.escalations)
        made.durable_engines = list(self.durable_engines)
        made.event_settings = self.event_settings
        return made

    @contextlib.contextmanager
    def current(self) -> Iterator[Application]:
        """Make this application the current one while the block runs (this task and those
        it starts)."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)


def current_application() -> Application | None:
    """The application current in this context, if any."""
    return _current.get()


def ambient_application() -> Application:
    """The current application; without one, an unattached one made current in this
    context (what an app module configures at import before any database is named)."""
    found = _current.get()
    if found is None:
        found = Application()
        _current.set(found)
    return found


def connected_application() -> Application:
    """The current application with an open connection; NotConnectedError otherwise."""
    found = _current.get()
    if found is None or found.connection is None:
        raise NotConnectedError()
    return found
