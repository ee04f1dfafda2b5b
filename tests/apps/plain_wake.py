"""A plain app for the Lambda cold-start test: one workflow, its attempt log, no events.

What a team that only runs workflows deploys: its wake path should load no
event layer, no graph layer and no pydantic (its steps take no arguments).
"""

from __future__ import annotations

from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import AttemptLog, Workflow, step


class Base(DeclarativeBase):
    pass


class Ping(Base, Workflow):
    __tablename__ = "plain_pings"

    id: Mapped[int] = mapped_column(primary_key=True)
    answered: Mapped[bool] = mapped_column(default=False)

    @step
    async def ping(self) -> object:
        return Ping.pong

    @step
    async def pong(self) -> None:
        self.answered = True


class PingAttempt(Base, AttemptLog):
    __tablename__ = "plain_ping_attempts"
