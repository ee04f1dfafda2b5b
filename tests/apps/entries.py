"""Workflows for the entry steps' tests: one that declares where runs start, one that does not."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, declare_engine_tables, step


class Base(DeclarativeBase):
    """The entry steps' tests' base."""


class Parcel(Base, Workflow):
    """Runs start at `charge` or `imported`; `ship` only ever follows them."""

    __tablename__ = "consignment"

    id: Mapped[int] = mapped_column(primary_key=True)
    label: Mapped[str] = mapped_column(String, default="")

    @step(entry=True)
    async def charge(self, amount: int = 0) -> object:
        return Parcel.ship

    @step(entry=True)
    async def imported(self) -> object:
        return Parcel.ship

    @step
    async def ship(self) -> None:
        self.label = "shipped"


class Errand(Base, Workflow):
    """No entry step declared: a run may start at any step, as before."""

    __tablename__ = "errand"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def first(self) -> object:
        return Errand.second

    @step
    async def second(self) -> None:
        return None


Attempt = declare_engine_tables(Base, events=False, names={"attempt_log": "consignment_attempt"})
