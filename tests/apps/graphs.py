"""A test app for graph workflows: the graph tables and one subject, on their own base."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import Numeric, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine.graphs.moves.subjects import GraphSubject
from engine.graphs.moves.timers import GraphTimer
from engine.graphs.tables import (
    GraphBranch,
    GraphHistory,
    GraphInstance,
    GraphNode,
    GraphTemplate,
    GraphTransition,
    GraphVisit,
    GraphVote,
)


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


class Timer(Base, GraphTimer):
    pass


class Claim(Base, GraphSubject):
    """A subject: an expense claim people approve."""

    __tablename__ = "claims"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(Text, default="")
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2), default=Decimal(0))
