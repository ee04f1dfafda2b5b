"""A graph test's world: its database, a graph runtime on it, and the rows to look at.

`make_world(db)` creates the graph test app's tables and the outbox's, and yields a
`World` connected for the test; `node_id` and `only_branch` read a graph and an
instance the way every graph test needs.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import DatabaseEventRegistry, EventSettings, connect_workflows
from engine.graphs.design.model import Graph
from engine.graphs.moves.conditions import ConditionRegistry
from engine.graphs.moves.directory import StaticDirectory
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.moves.snapshots import InstanceSnapshot
from engine.graphs.tables import GraphTables, graph_tables
from engine.model.connection import session_engine
from infra.pytest_plugin import Database
from tests.apps import graphs as app
from tests.apps import outbox as outbox_app
from tests.graph_helpers import stored

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
