"""A workflow with a length-limited text column, an enum and JSON, for the commit paths' tests."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Enum, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, step
from engine.model.companions import Companion, CompanionShape, commit_with


class Base(DeclarativeBase):
    """The bounded workflow's base."""


class Kind(enum.Enum):
    small = "small"
    big = "big"


class Bounded(Base, Workflow):
    __tablename__ = "bounded"

    id: Mapped[int] = mapped_column(primary_key=True)
    code: Mapped[str] = mapped_column(String(4))
    kind: Mapped[Kind] = mapped_column(Enum(Kind), default=Kind.small)
    tags: Mapped[list[Any]] = mapped_column(JSON, default=list)

    @step
    async def go(self) -> None:
        """Nothing: the tests write outcomes themselves."""

    @step
    async def note(self) -> None:
        """Write a note with this step's commit."""
        shape = CompanionShape(Note.__table__, ("run_id", "topic", "count"))
        commit_with(Companion(shape, ((self.id, "step", 1),)))


class Note(Base):
    """Rows steps write with their commits (engine.model.companions)."""

    __tablename__ = "bounded_notes"

    run_id: Mapped[int] = mapped_column(primary_key=True)
    topic: Mapped[str] = mapped_column(String(8), primary_key=True)
    count: Mapped[int] = mapped_column(default=0)
    written_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
