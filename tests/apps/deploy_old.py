"""The release before a deploy: `Order` as it was, with its step `review`.

`tests/apps/deploy_new.py` maps the same table on a base of its own, as the
next release's code does; a worker process imports one of the two
(`tests/apps/deploy_worker.py`), so each has only its own release's steps.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, declare_engine_tables, step

STEP_SECONDS = 0.01  # long enough for two workers' claims to interleave
RELEASE = "old"


class Base(DeclarativeBase):
    """The old release's base."""


class Order(Base, Workflow):
    __tablename__ = "deploy_order"

    id: Mapped[int] = mapped_column(primary_key=True)
    ran_by: Mapped[str] = mapped_column(String(10), default="")  # the release that ran it
    reviewer: Mapped[str] = mapped_column(String(40), default="")
    tallied: Mapped[int] = mapped_column(default=0)

    @step(retries=3)
    async def review(self, reviewer: str) -> None:
        await asyncio.sleep(STEP_SECONDS)
        self.ran_by = RELEASE
        self.reviewer = reviewer

    @step(retries=3)
    async def tally(self, count: int) -> None:
        # A bug, not a misfit: the arguments bind, the body raises TypeError.
        self.tallied = self.tallied + str(count)  # type: ignore[operator]


OrderAttempt = declare_engine_tables(
    Base, events=False, names={"attempt_log": "deploy_attempt"}
).attempt_log
