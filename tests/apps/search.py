"""A payments workflow with indexed columns of each kind, for the search of runs' tests.

`amount`, `created_at` and `urgent` lead indexes (so filters may compare them), `customer`
leads only a partial one (which holds some rows only); DULY_APP=tests.apps.search serves it.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import Boolean, DateTime, Index, Numeric, String, false, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, step


class Base(DeclarativeBase):
    """The payments workflow's base."""


class Payment(Base, Workflow):
    __tablename__ = "payment"

    id: Mapped[int] = mapped_column(primary_key=True)
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2), index=True)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), index=True
    )
    customer: Mapped[str] = mapped_column(String, default="")
    urgent: Mapped[bool] = mapped_column(Boolean, server_default=false(), index=True)

    __table_args__ = (Index("ix_payment_customer_urgent", "customer", postgresql_where=urgent),)

    @step
    async def charge(self) -> None:
        """Nothing: the tests write outcomes themselves."""

    @step
    async def refund(self) -> None:
        """Nothing: the tests write outcomes themselves."""
