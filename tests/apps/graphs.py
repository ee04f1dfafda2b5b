"""A test app for graph workflows: the graph tables and one subject, on their own base."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import Numeric, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import declare_engine_tables
from engine.graphs.moves.subjects import GraphSubject


class Base(DeclarativeBase):
    pass


tables = declare_engine_tables(Base, events=False, attempts=False, graphs=True).graphs
Template, Instance, Branch = tables.template, tables.instance, tables.branch
Visit, Vote, History, Timer = tables.visit, tables.vote, tables.history, tables.timer


class Claim(Base, GraphSubject):
    """A subject: an expense claim people approve."""

    __tablename__ = "claims"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(Text, default="")
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2), default=Decimal(0))
