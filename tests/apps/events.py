"""Workflows for the tests of waiting for events, steered by module globals."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, declare_engine_tables, every, step, wait_for


class Base(DeclarativeBase):
    """The event tests' base."""


gate = asyncio.Event()  # a step that passes through `gate` waits here until the test opens it
then: list[str] = []  # what Chat.talk does after the gate: "wait", "other", "stop", "schedule"


class Chat(Base, Workflow):
    """A conversation: answers each message, then waits for the next one."""

    __tablename__ = "chat"

    id: Mapped[int] = mapped_column(primary_key=True)
    transcript: Mapped[str] = mapped_column(String, default="")
    timeouts: Mapped[int] = mapped_column(default=0)

    @step
    async def open(self) -> object:
        return await self._after("open")

    @step
    async def message(self, text: str) -> object:
        self.transcript += f"[{text}]"
        return await self._after("message")

    @step
    async def other(self, text: str) -> None:
        self.transcript += f"<{text}>"

    @step
    async def quiet(self) -> None:
        self.timeouts += 1

    async def _after(self, where: str) -> object:
        if then and then[0] == "gate":
            then.pop(0)
            await gate.wait()
        what = then.pop(0) if then else "wait"
        if what == "other":
            return wait_for(Chat.other)
        if what == "stop":
            return None
        if what == "schedule":
            return every(Chat.open, timedelta(days=1))
        if what == "timeout":
            return wait_for(Chat.message, timeout=timedelta(hours=1), on_timeout=Chat.quiet)
        return wait_for(Chat.message)


ChatAttempt = declare_engine_tables(
    Base, events=False, names={"attempt_log": "chat_attempt"}
).attempt_log
