"""A graph test's world: its database, a graph runtime on it, and the rows to look at.

`make_world(db)` creates the graph test app's tables and the outbox's, and yields a
`World` connected for the test; `node_id` and `only_branch` read a graph and an
instance the way every graph test needs.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import DatabaseEventRegistry, EventSettings, connect_workflows
from engine.graphs.design.model import Graph
from engine.graphs.moves.conditions import ConditionRegistry
from engine.graphs.moves.directory import StaticDirectory
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.moves.snapshots import InstanceSnapshot
from engine.graphs.tables import END, START, STATE, GraphTables, graph_tables
from engine.model.connection import session_engine
from infra.testing.pytest_plugin import Database
from tests.apps import graphs as app, outbox as outbox_app
from tests.graph_helpers import graph_of, stored
from tests.helpers import sessions_waiting_for_a_lock, wait_until

Sessions = async_sessionmaker[AsyncSession]
TABLES = graph_tables(app.Base)


@dataclass
class World:
    """One test's database, runtime and event registry."""

    Session: Sessions
    runtime: GraphRuntime
    registry: DatabaseEventRegistry
    conditions: ConditionRegistry

    @property
    def tables(self) -> GraphTables:
        return self.runtime.tables

    async def store(self, graph: Graph, *, active: bool = True) -> Graph:
        async with session_engine(self.Session).begin() as conn:
            return await stored(conn, self.tables, graph, active=active)

    async def claim(self, amount: str = "10.00") -> app.Claim:
        async with self.Session() as session:
            claim = app.Claim(title="a claim", amount=Decimal(amount))
            session.add(claim)
            await session.commit()
            return claim

    async def rows(self, model: type[Any], *where: Any, order: Any = None) -> list[Any]:
        async with self.Session() as session:
            query = select(model).where(*where)
            if order is not None:
                query = query.order_by(order)
            return list((await session.scalars(query)).all())

    async def subject_state(self, claim: app.Claim) -> str | None:
        async with self.Session() as session:
            found = await session.get(app.Claim, claim.id, populate_existing=True)
            assert found is not None
            return found.workflow_state

    async def events(self, event_type: str | None = None) -> list[outbox_app.Event]:
        where = [] if event_type is None else [outbox_app.Event.event_type == event_type]
        return await self.rows(outbox_app.Event, *where, order=outbox_app.Event.created_at)

    async def actions(self, instance_id: uuid.UUID) -> list[str]:
        return [entry.action_type for entry in await self.runtime.history(instance_id)]


def node_id(graph: Graph, key: str) -> uuid.UUID:
    """The id of the node drawn under `key`."""
    node = graph.by_key(key)
    assert node is not None, key
    return node.id


def only_branch(instance: InstanceSnapshot) -> uuid.UUID:
    """The id of the instance's one branch."""
    assert len(instance.branches) == 1, instance.branches
    return instance.branches[0].id


async def make_world(
    db: Database,
    groups: Mapping[str, Iterable[str]] | None = None,
    conditions: ConditionRegistry | None = None,
) -> AsyncIterator[World]:
    """A world on `db`: the graph, outbox and clock tables, connected for the test."""
    Session = await db.create(app.Base.metadata, outbox_app.Base.metadata)
    registry = DatabaseEventRegistry(
        outbox=outbox_app.Outbox,
        settings=EventSettings(mode="production", async_delivery=True),
    )
    chosen = conditions if conditions is not None else ConditionRegistry()
    runtime = GraphRuntime(
        TABLES, directory=StaticDirectory(groups or {}), conditions=chosen, events=registry
    )
    async with connect_workflows(Session):
        yield World(Session, runtime, registry, chosen)


LINEAR_NODES: dict[str, Any] = {
    "start": START,
    "review": (STATE, "review", ["ann"]),
    "rework": (STATE, "rework", ["bob"]),
    "approved": (STATE, "approved", ["cat"]),
    "end": END,
}
LINEAR_EDGES: list[Any] = [
    ("start", "review"),
    ("review", "approved", {"label": "Approve"}),
    ("review", "rework", {"label": "Send back", "comment_required": True}),
    ("rework", "review"),
    ("approved", "end"),
]


async def until_a_lock_is_awaited(world: World, timeout: float = 5.0) -> None:
    """Until some session of this test's database waits for a lock (another's write)."""
    engine = session_engine(world.Session)
    await wait_until(lambda: sessions_waiting_for_a_lock(engine), timeout, what="a lock awaited")


async def submitted(world: World, nodes: Any = None, edges: Any = None) -> tuple[Graph, Any, Any]:
    """A stored linear graph (or the one given), a claim, and its submitted instance."""
    graph = await world.store(graph_of(nodes or LINEAR_NODES, edges or LINEAR_EDGES, name="claims"))
    claim = await world.claim()
    instance = await world.runtime.submit(claim, "sam", template_name="claims")
    return graph, claim, instance


@dataclass
class OneConnection:
    """A runtime on an engine of one pooled connection, and a linear claim submitted to it."""

    engine: AsyncEngine
    runtime: GraphRuntime
    world: World
    graph: Graph
    instance: Any
    branch: uuid.UUID


@contextlib.asynccontextmanager
async def one_connection(
    db: Database, events: DatabaseEventRegistry | None = None
) -> AsyncIterator[OneConnection]:
    """Every call of the runtime on the one connection, so what one leaves on it (a
    transaction, prepared statements) is what the next one finds."""
    Session = await db.create(app.Base.metadata, outbox_app.Base.metadata)
    engine = db.engine(pool_size=1, max_overflow=0)
    runtime = GraphRuntime(TABLES, engine=engine, events=events)
    async with connect_workflows(Session):
        world = World(Session, runtime, events or DatabaseEventRegistry(), ConditionRegistry())
        graph, _, instance = await submitted(world)
        yield OneConnection(engine, runtime, world, graph, instance, only_branch(instance))
