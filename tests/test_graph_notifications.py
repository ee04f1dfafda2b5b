"""A move's notifications (engine.graphs.moves.notifications): announced when they are committed.

- the outbox's wake-up is heard after a move, and the move's events are
  committed by then: test_a_moves_events_are_announced_when_they_are_committed
- a new deadline's timer and the submit's events are announced as the submit
  commits: test_a_new_timer_is_announced_as_it_commits
- a move's events are stored and queued by its write: the move sends two
  statements, the lock and the write: test_a_moves_write_stores_its_events

The assignment template an assignment names:
- an in-flight instance pinned to an older version, whose state names none,
  names the active version's for the same state code; a state that names its
  own keeps it: test_an_older_versions_state_falls_back_to_the_active_template,
  test_a_state_naming_its_own_template_keeps_it
"""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy import event as sa_event, update

from engine import DatabaseEventRegistry, EventSettings, connect_workflows
from engine.base.notify import CHANNEL
from engine.graphs.moves.conditions import ConditionRegistry
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.tables import END, START, STATE
from engine.model.connection import session_engine
from tests.apps import graphs as app, outbox as outbox_app
from tests.conftest import Database
from tests.graph_helpers import escalating, graph_of
from tests.graph_world import TABLES, World, make_world, node_id, one_connection, only_branch


def registry() -> DatabaseEventRegistry:
    return DatabaseEventRegistry(
        outbox=outbox_app.Outbox,
        settings=EventSettings(mode="production", async_delivery=True),
    )


async def test_a_moves_events_are_announced_when_they_are_committed(db: Database) -> None:
    async with one_connection(db, registry()) as one:
        runtime, world = one.runtime, one.world
        graph, instance, branch = one.graph, one.instance, one.branch
        listener = await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True)
        try:
            await listener.execute(f'LISTEN "{CHANNEL}"')
            await runtime.transition_branch(
                instance.id, branch, node_id(graph, "rework"), "ann", "again"
            )
            heard = await anext(aiter(listener.notifies(timeout=5)))
        finally:
            await listener.close()
        assert heard.payload == outbox_app.Outbox.__table__.name
        # The events were committed when the workers were told.
        assert len(await world.events("duly.graph.state_assignment")) == 2


async def test_a_moves_write_stores_its_events(db: Database) -> None:
    async with one_connection(db, registry()) as one:
        sent: list[str] = []

        def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            sent.append(statement.split(None, 2)[1] if statement.startswith("WITH") else "lock")

        sa_event.listen(one.engine.sync_engine, "before_cursor_execute", record)
        try:
            await one.runtime.transition_branch(
                one.instance.id, one.branch, node_id(one.graph, "rework"), "ann", "again"
            )
        finally:
            sa_event.remove(one.engine.sync_engine, "before_cursor_execute", record)
        assert sent == ["lock", "move"]  # the write's first CTE is the document, "move"
        [_, moved] = await one.world.events("duly.graph.state_assignment")
        assert moved.payload["node_id"] == str(node_id(one.graph, "rework"))
        queued = await one.world.rows(
            outbox_app.Outbox, outbox_app.Outbox.event_id == moved.event_id
        )
        assert [(row.event_type, row.status) for row in queued] == [(moved.event_type, "pending")]


async def test_a_new_timer_is_announced_as_it_commits(db: Database) -> None:
    Session = await db.create(app.Base.metadata, outbox_app.Base.metadata)
    runtime = GraphRuntime(TABLES, events=registry())
    async with connect_workflows(Session):
        world = World(Session, runtime, registry(), ConditionRegistry())
        await world.store(escalating())
        listener = await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True)
        try:
            await listener.execute(f'LISTEN "{CHANNEL}"')
            await runtime.submit(await world.claim(), "sam", template_name="escalating")
            heard = set()
            async for notice in listener.notifies(timeout=5, stop_after=2):
                heard.add(notice.payload)
        finally:
            await listener.close()
        [timer] = await world.rows(app.Timer)
    assert heard == {app.Timer.__table__.name, outbox_app.Outbox.__table__.name}
    assert timer.next_step == "expire"


def templated(version: int, approved_template: str | None) -> Any:
    """review (ann) -> approved (cat) -> end, naming `approved_template` on approved only."""
    approved = {"type": STATE, "state_code": "approved", "assignee_users": ["cat"],
                "assignment_template": approved_template}  # fmt: skip
    nodes = {"start": START, "review": (STATE, "review", ["ann"]), "approved": approved}
    edges = [("start", "review"), ("review", "approved"), ("approved", "end")]
    return graph_of({**nodes, "end": END}, edges, name="claims", version=version)


async def test_an_older_versions_state_falls_back_to_the_active_template(db: Database) -> None:
    async for world in make_world(db):
        runtime, Session = world.runtime, world.Session
        first = await world.store(templated(1, None))
        pinned = await runtime.submit(await world.claim(), "sam", template_name="claims")
        # Version 2 names a template for approved, and becomes the active version.
        second = await world.store(templated(2, "approved-mail"), active=False)
        templates = app.Template.__table__
        async with session_engine(Session).begin() as conn:
            active = templates.c.id == second.template_id
            await conn.execute(update(templates).values(is_active=active))
        await runtime.transition_branch(
            pinned.id, only_branch(pinned), node_id(first, "approved"), "ann"
        )
        [event] = [
            e
            for e in await world.events("duly.graph.state_assignment")
            if e.payload["state_code"] == "approved"
        ]
        assert event.payload["version"] == 1
        assert event.payload["assignment_template"] == "approved-mail"
        # A state of the active version that names none has none to fall back to.
        [review] = [
            e
            for e in await world.events("duly.graph.state_assignment")
            if e.payload["state_code"] == "review"
        ]
        assert review.payload["assignment_template"] is None


async def test_a_state_naming_its_own_template_keeps_it(db: Database) -> None:
    async for world in make_world(db):
        runtime, Session = world.runtime, world.Session
        first = await world.store(templated(1, "old-mail"))
        pinned = await runtime.submit(await world.claim(), "sam", template_name="claims")
        second = await world.store(templated(2, "approved-mail"), active=False)
        templates = app.Template.__table__
        async with session_engine(Session).begin() as conn:
            active = templates.c.id == second.template_id
            await conn.execute(update(templates).values(is_active=active))
        await runtime.transition_branch(
            pinned.id, only_branch(pinned), node_id(first, "approved"), "ann"
        )
        [event] = [
            e
            for e in await world.events("duly.graph.state_assignment")
            if e.payload["state_code"] == "approved"
        ]
        assert event.payload["assignment_template"] == "old-mail"
