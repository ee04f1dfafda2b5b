"""A workflow keyed by text, for run keys with `/` in them (`x/cancel`, `a/b`)."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, step, wait_for


class Base(DeclarativeBase):
    """The slashed keys' base."""


class Ticket(Base, Workflow):
    """Opened, then waits to be closed."""

    __tablename__ = "slash_ticket"

    code: Mapped[str] = mapped_column(String(40), primary_key=True)
    status: Mapped[str] = mapped_column(String, default="new")

    @step
    async def open(self) -> object:
        self.status = "open"
        return wait_for(Ticket.close)

    @step
    async def close(self, reason: str = "done") -> None:
        self.status = f"closed: {reason}"
