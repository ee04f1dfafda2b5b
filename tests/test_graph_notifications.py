"""A move's notifications (engine.graphs.moves.notifications): announced when they are committed.

- the outbox's wake-up is heard after a move, and the move's events are
  committed by then: test_a_moves_events_are_announced_when_they_are_committed
- a new deadline's timer and the submit's events are announced as the submit
  commits: test_a_new_timer_is_announced_as_it_commits
"""

from __future__ import annotations

import psycopg

from engine import DatabaseEventRegistry, EventSettings, connect_workflows
from engine.graphs.moves.conditions import ConditionRegistry
from engine.graphs.moves.runtime import GraphRuntime
from engine.notify import CHANNEL
from tests.apps import graphs as app
from tests.apps import outbox as outbox_app
from tests.conftest import Database
from tests.test_graph_runtime import TABLES, World, node_id, one_connection
from tests.test_graph_timers import escalating


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
