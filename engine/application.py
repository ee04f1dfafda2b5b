"""`Duly`: the application object a door builds once and every ambient call finds.

    app = Duly(Session, event_registry=registry, graph_runtime=runtime)
    async with app.running():          # or connect_workflows(app) / run_workflows(app)
        await Onboarding(email=e).start(Onboarding.welcome)

It owns what was once the process's (`engine.model.application.Application`)
and offers the doors' operations by delegating to the engine's own
functions. Why: docs/architecture.md, "The application object".
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Any

from engine.base.errors import NotConnectedError
from engine.bulk.runs import RunPlan, plan_runs
from engine.model.application import Application
from engine.model.connection import WorkflowConnection, connect_workflows
from engine.testing import move_clock, reset_clock
from engine.views.filters import RunFilter, parse_key
from engine.views.overview import Overview, overview
from engine.views.run import RunDetail, run_detail
from engine.views.runs import RunPage, find_workflow, list_runs
from engine.views.schedules import ScheduledRun, list_schedules
from engine.worker.loop import Worker
from engine.worker.running import run_workflows


class Duly(Application):
    """One duly application: a session factory and its parts, current while it serves."""

    def connect(self) -> AbstractAsyncContextManager[WorkflowConnection]:
        """Its connection open and it current while the block runs (no worker)."""
        return connect_workflows(self)

    def running(self, **options: Any) -> AbstractAsyncContextManager[Worker]:
        """A worker for its workflows while the block runs (`run_workflows`' options)."""
        return run_workflows(self, **options)

    def open(self) -> WorkflowConnection:
        """Its open connection; NotConnectedError outside `connect` or `running`."""
        if self.connection is None:
            raise NotConnectedError()
        return self.connection

    @property
    def graphs(self) -> Any:
        """Its `GraphRuntime`: saves, activations, submits and moves (None without graphs)."""
        return self.graph_runtime

    async def overview(self) -> Overview:
        """Every workflow's counts, and the outbox's when it maps one."""
        registry = self.event_registry
        tables = registry.tables() if callable(getattr(registry, "tables", None)) else None
        return await overview(self.open(), tables)

    async def runs(self, workflow: str, **page: Any) -> RunPage:
        """A page of `workflow`'s runs (`engine.views.runs.list_runs`' filters and order)."""
        connection = self.open()
        return await list_runs(connection, find_workflow(connection, workflow), **page)

    async def run(self, workflow: str, key: str) -> RunDetail:
        """One run of `workflow` in full, by its key as text."""
        connection = self.open()
        info = find_workflow(connection, workflow)
        return await run_detail(connection, info, parse_key(info, key))

    async def schedules(self) -> list[ScheduledRun]:
        """Every scheduled run of its workflows."""
        return await list_schedules(self.open())

    async def plan_bulk(self, workflow: str, filters: RunFilter) -> RunPlan:
        """A bulk action's dry run over `workflow`'s runs (`engine.bulk`'s batches act on it)."""
        connection = self.open()
        return await plan_runs(connection, find_workflow(connection, workflow), filters)

    async def replay_dead_letters(self, event_ids: list[str] | None = None) -> list[str]:
        """Make its outbox's dead letters (all, or these) due again; their ids."""
        replayed: list[str] = await self.event_registry.replay_dead_letters(event_ids)
        return replayed

    async def publish(self, event: Any) -> bool:
        """Publish `event` through its event registry."""
        result: bool = await self.event_registry.publish(event)
        return result

    async def move_clock(self, by: timedelta) -> timedelta:
        """Move its database's clock (tests)."""
        assert self.Session is not None
        shift: timedelta = await move_clock(self.Session, by)
        return shift

    async def reset_clock(self) -> None:
        """Put its database's clock back (tests)."""
        assert self.Session is not None
        await reset_clock(self.Session)
