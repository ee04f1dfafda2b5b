"""A workflow whose step fails the way a careless app fails: a secret in its error."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, declare_engine_tables, step


class Base(DeclarativeBase):
    """The failing app's base."""


class Payment(Base, Workflow):
    __tablename__ = "card_payment"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step(retries=1, backoff=timedelta(seconds=30))
    async def charge(self, amount: int, card: dict[str, Any], message: str = "") -> None:
        # The error names the configured token and a database URL with its password.
        token = os.environ.get("DULY_API_TOKEN", "")
        raise ConnectionError(
            f"gateway refused {amount} with token {token} "
            f"(ledger postgresql://ledger:ledger-pass-7@db:5432/ledger) {message}"
        )

    @step
    async def refund(self, amount: int) -> None:
        """A step that works: what an operator runs on a failed payment."""


Attempt = declare_engine_tables(
    Base, events=False, names={"attempt_log": "card_payment_attempt"}
).attempt_log
