"""The next release: `Order`'s step `review` renamed `review_v2`, which takes rows that still
name `review` through its alias. The same table as `tests/apps/deploy_old.py`, on a base of its
own."""

from __future__ import annotations

import asyncio

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, declare_engine_tables, step

STEP_SECONDS = 0.01
RELEASE = "new"
FAILING_REVIEWER = "nobody"  # a review by this reviewer fails, to be retried


class Base(DeclarativeBase):
    """The new release's base."""


class Order(Base, Workflow):
    __tablename__ = "deploy_order"

    id: Mapped[int] = mapped_column(primary_key=True)
    ran_by: Mapped[str] = mapped_column(String(10), default="")
    reviewer: Mapped[str] = mapped_column(String(40), default="")
    tallied: Mapped[int] = mapped_column(default=0)

    @step(aliases=("review",), retries=3)
    async def review_v2(self, reviewer: str) -> None:
        await asyncio.sleep(STEP_SECONDS)
        if reviewer == FAILING_REVIEWER:
            raise RuntimeError("no such reviewer")
        self.ran_by = RELEASE
        self.reviewer = reviewer


OrderAttempt = declare_engine_tables(
    Base, events=False, names={"attempt_log": "deploy_attempt"}
).attempt_log
