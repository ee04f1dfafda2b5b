"""A workflow for the HTTP write routes: typed columns, a CHECK, and steps with typed arguments."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import CheckConstraint, DateTime, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, declare_engine_tables, step, wait_for

Plan = Literal["basic", "gold"]


class Base(DeclarativeBase):
    """The API tests' base."""


class Invoice(Base, Workflow):
    """Issued, then waits up to a day to be paid (`pay`), else is chased."""

    __tablename__ = "invoice"
    __table_args__ = (CheckConstraint("total >= 0", name="invoice_total_positive"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    number: Mapped[str] = mapped_column(String(20), unique=True)
    total: Mapped[int] = mapped_column()
    due: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    note: Mapped[str] = mapped_column(String, default="")
    status: Mapped[str] = mapped_column(String, default="new")

    @step
    async def issue(self, plan: Plan = "basic") -> object:
        self.status = f"issued ({plan})"
        return wait_for(Invoice.pay, timeout=timedelta(days=1), on_timeout=Invoice.chase)

    @step
    async def pay(self, amount: int, *, by: str = "card") -> None:
        self.status = f"paid {amount} by {by}"

    @step
    async def chase(self) -> None:
        self.status = "chased"

    @step
    async def explode(self) -> None:
        raise RuntimeError("boom")

    @step(retries=5, backoff=timedelta(hours=1))
    async def flaky(self) -> None:
        raise RuntimeError("not yet")

    @step
    async def tag(self, labels: list[str], *extra: int, **more: float) -> None:
        self.note = ",".join(labels)

    @step
    async def anything(self, value: Any, other=None, at: datetime | None = None) -> None:  # type: ignore[no-untyped-def]
        self.note = repr(value)


InvoiceAttempt = declare_engine_tables(
    Base, events=False, names={"attempt_log": "invoice_attempt"}
).attempt_log
