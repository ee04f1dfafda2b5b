"""The example workflows `duly dev` serves when DULY_APP is not set.

`Onboarding` is the seed's example as written, but for the import; its
`send_email` and `has_activated` are stubs that log, so a local run shows
every step as it happens.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Literal

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import AttemptLog, Workflow, step, wake_in

log = logging.getLogger("duly.examples")

sent_emails: list[tuple[str, str]] = []  # (address, template), for tests and the dev log
activated_users: set[str] = set()  # users has_activated() reports as active


async def send_email(address: str, template: str) -> None:
    """Stand-in for an email provider: logs and remembers what it would send."""
    sent_emails.append((address, template))
    log.info("send_email(%r, %r)", address, template)


async def has_activated(user_id: str) -> bool:
    """Stand-in for the product's own check."""
    return user_id in activated_users


class Base(DeclarativeBase):
    """The examples' declarative base."""


class Onboarding(Base, Workflow):
    __tablename__ = "onboarding"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[str] = mapped_column(String, unique=True)
    email: Mapped[str] = mapped_column(String)
    nudges: Mapped[int] = mapped_column(default=0)
    status: Mapped[str] = mapped_column(String, default="welcoming")

    @step(retries=3)
    async def welcome(self):
        await send_email(self.email, "welcome")
        self.status = "waiting"
        return wake_in(Onboarding.check, timedelta(days=3))

    @step
    async def check(self):
        if await has_activated(self.user_id):
            self.status = "activated"
            return None
        self.nudges += 1
        await send_email(self.email, f"nudge_{self.nudges}")
        return wake_in(Onboarding.check, timedelta(days=4)) if self.nudges < 2 else None

    @step
    async def activated(self, plan: Literal["free", "pro"]):
        self.status = f"activated:{plan}"


class WorkflowAttempt(Base, AttemptLog):
    __tablename__ = "workflow_attempt"
