"""Errors that stop a run: no retry, whatever retries the step has left.

- a step with retries=5 raising an error it names in `stop_on` fails on its first
  attempt: test_a_named_error_fails_the_run_on_its_first_attempt
- a subclass of a named error stops it too, also from a plain `def` step:
  test_a_subclass_of_a_named_error_stops_the_run_too
- duly's own `StepFailed` stops any step: test_step_failed_stops_the_run
- an error not named is retried as before: test_an_error_not_named_is_still_retried
- bad `stop_on` values are refused where the step is declared:
  test_stop_on_takes_exception_classes_only
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import ConfigurationError, StepFailed, connect_workflows, step
from engine.testing import drain
from tests.apps import controls
from tests.apps.controls import Charge
from tests.conftest import Database
from tests.helpers import fetch


async def charged(db: Database, target: Any) -> async_sessionmaker[AsyncSession]:
    """Charge 1 started at `target` and drained once."""
    Session = await db.create(controls.Base.metadata)
    async with connect_workflows(Session, workflows=[Charge]):
        assert await Charge(id=1).start(target)
    assert await drain(Session, [Charge]) == 1
    return Session


async def verdicts(Session: async_sessionmaker[AsyncSession]) -> list[tuple[int, str, str]]:
    """The attempt log of charge 1: attempt number, verdict, error."""
    async with Session() as session:
        rows = await session.execute(select(controls.Attempt).order_by(controls.Attempt.id))
        return [(a.attempt, a.outcome, a.error or "") for (a,) in rows]


async def assert_failed_at_once(Session: async_sessionmaker[AsyncSession], error: str) -> None:
    row = await fetch(Session, Charge, 1)
    assert (row.next_step, row.attempts, row.last_error) == (None, 1, error)
    assert row.claimed_until is None and row.tries == 0  # the failed attempt's change is dropped
    assert await verdicts(Session) == [(1, "failed", error)]
    assert await drain(Session, [Charge]) == 0, "nothing left to retry"


async def test_a_named_error_fails_the_run_on_its_first_attempt(db: Database) -> None:
    Session = await charged(db, Charge.charge("declined"))
    await assert_failed_at_once(Session, "CardDeclined: card 4242 declined")


async def test_a_subclass_of_a_named_error_stops_the_run_too(db: Database) -> None:
    Session = await charged(db, Charge.charge("expired"))
    await assert_failed_at_once(Session, "CardExpired: card 4242 expired")
    async with connect_workflows(Session, workflows=[Charge]):
        assert await Charge.by_key(1).run(Charge.charge_plainly) == 1
    assert await drain(Session, [Charge]) == 1
    row = await fetch(Session, Charge, 1)
    assert (row.next_step, row.attempts) == (None, 1)
    assert (await verdicts(Session))[-1] == (1, "failed", "CardExpired: card 4242 expired")


async def test_step_failed_stops_the_run(db: Database) -> None:
    Session = await charged(db, Charge.charge("failed"))
    await assert_failed_at_once(Session, "StepFailed: the shop closed the order")


async def test_an_error_not_named_is_still_retried(db: Database) -> None:
    Session = await charged(db, Charge.charge("unreachable"))
    row = await fetch(Session, Charge, 1)
    assert (row.next_step, row.attempts) == ("charge", 1)
    assert row.last_error == "ConnectionError: gateway unreachable"
    assert await verdicts(Session) == [(1, "retry", "ConnectionError: gateway unreachable")]


def test_stop_on_takes_exception_classes_only() -> None:
    for wrong in ("CardDeclined", [ValueError, "KeyError"], [42], [BaseException]):
        with pytest.raises(ConfigurationError, match="stop_on takes exception classes"):
            step(stop_on=wrong)  # type: ignore[arg-type]
    assert issubclass(StepFailed, Exception)
