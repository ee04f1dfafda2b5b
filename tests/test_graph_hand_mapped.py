"""A base that maps the graph mixins by hand, without `declare_engine_tables`, gets
`duly_clock` with them (as a workflow's base does): `create_all`, then a submit works."""

from __future__ import annotations

from sqlalchemy import Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    GraphBranch,
    GraphHistory,
    GraphInstance,
    GraphNode,
    GraphTemplate,
    GraphTransition,
    GraphVisit,
    GraphVote,
)
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.moves.subjects import GraphSubject
from engine.graphs.tables import graph_tables
from engine.model.connection import session_engine
from infra.testing.pytest_plugin import Database
from tests.graph_helpers import graph_of, stored
from tests.graph_world import LINEAR_EDGES, LINEAR_NODES


class Base(DeclarativeBase):
    pass


class Template(Base, GraphTemplate):
    pass


class Node(Base, GraphNode):
    pass


class Transition(Base, GraphTransition):
    pass


class Instance(Base, GraphInstance):
    pass


class Branch(Base, GraphBranch):
    pass


class Visit(Base, GraphVisit):
    pass


class Vote(Base, GraphVote):
    pass


class History(Base, GraphHistory):
    pass


class Report(Base, GraphSubject):
    """The subject."""

    __tablename__ = "hand_mapped_reports"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(Text, default="")


def test_the_clock_table_is_declared_with_the_graph_tables() -> None:
    assert "duly_clock" in Base.metadata.tables


async def test_a_hand_mapped_graph_base_submits_after_create_all(db: Database) -> None:
    Session = await db.create(Base.metadata)
    tables = graph_tables(Base)
    runtime = GraphRuntime(tables, engine=session_engine(Session))
    async with session_engine(Session).begin() as conn:
        await stored(conn, tables, graph_of(LINEAR_NODES, LINEAR_EDGES, name="reports"))
    async with Session() as session:
        report = Report(title="quarterly")
        session.add(report)
        await session.commit()
    instance = await runtime.submit(report, "sam", template_name="reports")
    assert instance.state_code == "review"
    assert db.sql("SELECT to_regclass('duly_clock') IS NOT NULL") == [(True,)]
