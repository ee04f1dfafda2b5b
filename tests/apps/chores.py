"""A workflow for the bulk actions' tests: a step that counts, one that fails, one held open."""

from __future__ import annotations

import asyncio

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, declare_engine_tables, step

gate = asyncio.Event()  # lets a held step finish
held: list[int] = []  # the runs whose `hold` step has started


class Base(DeclarativeBase):
    """The bulk tests' base."""


class Chore(Base, Workflow):
    """A run that counts its `work`, fails at `explode`, and waits at `hold` for the gate."""

    __tablename__ = "chore"

    id: Mapped[int] = mapped_column(primary_key=True)
    label: Mapped[str] = mapped_column(String, default="")
    done: Mapped[int] = mapped_column(default=0)

    @step
    async def work(self, label: str = "") -> None:
        self.done += 1
        self.label = label

    @step
    async def explode(self) -> None:
        raise RuntimeError("boom")

    @step
    async def hold(self) -> None:
        held.append(self.id)
        await gate.wait()


class Shift(Base, Workflow):
    """A run named by two columns, a team and a day: keyset walks over a composite key."""

    __tablename__ = "shift"

    team: Mapped[str] = mapped_column(String, primary_key=True)
    day: Mapped[int] = mapped_column(primary_key=True)
    done: Mapped[int] = mapped_column(default=0)

    @step
    async def work(self) -> None:
        self.done += 1


declare_engine_tables(Base, events=False, names={"attempt_log": "chore_attempt"})
