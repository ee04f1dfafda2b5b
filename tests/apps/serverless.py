"""A small workflow for the serverless tests: a reminder that waits two hours.

`Reminder.plan` returns `wake_in(Reminder.send, LATER)`, so a worker that ran
it tells `on_idle` one instant two hours off (the row's `wake_at`), which is
what the EventBridge Scheduler registration must hold; `Reminder.send`
counts in `sent` that the wake-up ran it. Shared by the scheduler tests and
the end-to-end tests of the Lambda handlers.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, step, wake_in

LATER = timedelta(hours=2)  # how long after `plan` the reminder is sent


class Base(DeclarativeBase):
    """The serverless tests' own base."""


class Reminder(Base, Workflow):
    """Plans a reminder, then sends it LATER."""

    __tablename__ = "serverless_reminder"

    id: Mapped[int] = mapped_column(primary_key=True)
    sent: Mapped[int] = mapped_column(default=0)

    @step
    async def plan(self) -> object:
        """Come back in two hours."""
        return wake_in(Reminder.send, LATER)

    @step
    async def send(self) -> None:
        """The wake-up: counted, so a test sees it ran once."""
        self.sent += 1
