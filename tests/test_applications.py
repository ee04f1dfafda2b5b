"""Two duly applications on two databases, side by side in one process and one event loop.

Each has its own workflows' rows, outbox, graph runtime and worker; the ambient calls
(`row.start()`, `DatabaseEventRegistry()` without `outbox=`, a timer's escalation, the
outbox's routing) find their own application through the context variable, never a
module global (docs/architecture.md, "The application object").
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import DeclarativeBase

from engine import (
    ConfigurationError,
    DatabaseEventRegistry,
    Duly,
    EventSettings,
    WorkflowEvent,
    connect_workflows,
    declare_engine_tables,
)
from engine.graphs.moves.notifications import STATE_ASSIGNMENT
from engine.graphs.moves.runtime import GraphRuntime
from infra.testing.pytest_plugin import Database, Server, fresh_database
from tests.apps import graphs as app, outbox as outbox_app
from tests.graph_helpers import graph_of, stored
from tests.graph_world import LINEAR_EDGES, LINEAR_NODES, TABLES
from tests.helpers import wait_until

PING = "app.ping"


class SecondBase(DeclarativeBase):
    """A second outbox, beside the outbox tests' one in the same database."""


declare_engine_tables(SecondBase, prefix="second_", attempts=False)


async def serve(db: Database, name: str, seen: list[tuple[str, str]]) -> Duly:
    """One application on `db`: start a run, publish an event, submit a graph instance,
    and run its worker until its handlers saw both of its events."""
    Session = await db.create(app.Base.metadata, outbox_app.Base.metadata)
    # No outbox= : the registry finds the outbox of the application it serves.
    registry = DatabaseEventRegistry(settings=EventSettings(mode="production", async_delivery=True))

    async def heard(event: WorkflowEvent) -> None:
        seen.append((event.event_type, str(event.payload.get("app", ""))))

    async def assigned(event: WorkflowEvent) -> None:
        seen.append((event.event_type, str(event.payload["subject_key"])))

    registry.register(PING, heard)
    registry.register(STATE_ASSIGNMENT, assigned)
    duly = Duly(Session, event_registry=registry, graph_runtime=GraphRuntime(TABLES))
    duly.graph_runtime.events = registry
    async with duly.running(poll_interval=timedelta(milliseconds=50), max_concurrency=4):
        await outbox_app.Order(reference=f"{name}-order").start(outbox_app.Order.place)
        await registry.publish(WorkflowEvent(PING, payload={"app": name}))
        async with Session.begin() as session:
            claim = app.Claim(title=f"{name}'s claim")
            session.add(claim)
        async with duly.open().engine.begin() as conn:
            await stored(conn, TABLES, graph_of(LINEAR_NODES, LINEAR_EDGES, name="claims"))
        await duly.graphs.submit(claim, "sam", template_name="claims")
        await wait_until(lambda: len(seen) >= 2, timeout=20, what=f"{name}'s handlers")
        await wait_until(lambda: order_placed(Session), timeout=20, what=f"{name}'s order")
        # The doors' reads through the object see its own database only.
        page = await duly.runs("orders")
        assert [run.row["reference"] for run in page.runs] == [f"{name}-order"]
    return duly


async def order_placed(Session: Any) -> bool:
    async with Session() as session:
        statuses = (await session.scalars(select(outbox_app.Order.status))).all()
        return list(statuses) == ["placed"]


async def count(Session: Any, model: Any) -> int:
    async with Session() as session:
        return int(await session.scalar(select(func.count()).select_from(model)) or 0)


async def test_two_applications_on_two_databases_see_only_their_own(
    db: Database, server: Server
) -> None:
    async with fresh_database(server) as other:
        seen_a: list[tuple[str, str]] = []
        seen_b: list[tuple[str, str]] = []
        first, second = await asyncio.gather(serve(db, "a", seen_a), serve(other, "b", seen_b))
        for duly, name, seen in ((first, "a", seen_a), (second, "b", seen_b)):
            Session = duly.Session
            async with Session() as session:
                orders = (await session.scalars(select(outbox_app.Order.reference))).all()
                events = (await session.scalars(select(outbox_app.Event.event_type))).all()
                claims = (await session.scalars(select(app.Claim.title))).all()
            assert list(orders) == [f"{name}-order"]
            assert sorted(events) == sorted([PING, STATE_ASSIGNMENT])
            assert list(claims) == [f"{name}'s claim"]
            assert await count(Session, app.Instance) == 1
            # Each handler heard its own application's two events, and nothing of the other's.
            assert sorted(seen) == sorted([(PING, name), (STATE_ASSIGNMENT, "1")])


async def test_a_registry_without_an_outbox_refuses_a_database_with_two(db: Database) -> None:
    Session = await db.create(outbox_app.Base.metadata, SecondBase.metadata)
    async with connect_workflows(Session):
        registry = DatabaseEventRegistry(settings=EventSettings(mode="production"))
        with pytest.raises(ConfigurationError, match="more than one outbox"):
            await registry.publish(WorkflowEvent(PING))
    assert await count(Session, outbox_app.Event) == 0
