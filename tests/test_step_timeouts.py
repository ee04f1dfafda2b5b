"""Step timeouts: past its timeout a body is cancelled, and the attempt fails.

- a hanging body with timeout=0.2 s fails with a StepTimeoutError naming the timeout,
  is retried, then fails for good, in bounded time; its row is free at once after
  each attempt: test_a_hanging_step_times_out_is_retried_then_fails
- a timeout longer than the worker's lease: the lease is renewed until the timeout
  fires, so no other worker takes the row meanwhile, and none is left after:
  test_the_lease_lasts_until_the_timeout_and_not_after
- a TimeoutError the body raises itself is its own, not the step's timeout:
  test_a_timeout_error_of_the_body_is_its_own
- a body that swallows its cancellation and returns still failed its attempt:
  test_a_body_that_swallows_its_cancellation_still_timed_out
- what a body wrote through `step_session()` before it timed out is rolled back, and
  its transaction ended: test_a_timed_out_attempt_leaves_none_of_its_effects
- bad timeouts are refused where the step is declared: test_bad_timeouts_are_refused
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import ConfigurationError, connect_workflows, run_workflows, step
from engine.testing import drain
from tests.apps import controls
from tests.apps.controls import Hanging
from tests.conftest import Database
from tests.helpers import fetch, wait_until

TIMED_OUT = (
    "StepTimeoutError: Step Hanging.hang did not finish within its timeout of 0.2 s; "
    "the attempt was cancelled."
)


async def attempts(Session: async_sessionmaker[AsyncSession]) -> list[tuple[str, str, float]]:
    """Hanging 1's attempt log: verdict, error, milliseconds taken."""
    async with Session() as session:
        rows = await session.execute(select(controls.Attempt).order_by(controls.Attempt.id))
        return [(a.outcome, a.error or "", a.took_ms) for (a,) in rows]


async def test_a_hanging_step_times_out_is_retried_then_fails(db: Database) -> None:
    Session = await db.create(controls.Base.metadata)
    async with run_workflows(Session, workflows=[Hanging]):  # a 30 s lease
        began = time.monotonic()
        assert await Hanging(id=1).start(Hanging.hang)

        async def given_up() -> bool:
            return (await fetch(Session, Hanging, 1)).attempts == 2

        await wait_until(given_up, timeout=3)
        took = time.monotonic() - began
    # Two attempts of 0.2 s and a 50 ms backoff: the second began without waiting for a lease.
    assert 0.4 <= took < 1.5
    row = await fetch(Session, Hanging, 1)
    assert (row.next_step, row.last_error, row.note) == (None, TIMED_OUT, "")
    assert row.claimed_until is None
    log = await attempts(Session)
    assert [(verdict, error) for verdict, error, _ in log] == [
        ("retry", TIMED_OUT),
        ("failed", TIMED_OUT),
    ]
    assert all(200 <= took_ms < 600 for _, _, took_ms in log)


async def test_the_lease_lasts_until_the_timeout_and_not_after(db: Database) -> None:
    controls.began.clear()
    Session = await db.create(controls.Base.metadata)
    lease = timedelta(milliseconds=600)
    looking = timedelta(milliseconds=50)
    async with run_workflows(Session, workflows=[Hanging], lease=lease):
        assert await Hanging(id=1).start(Hanging.outlast_the_lease("a"))
        # A second worker looks the whole time: without renewals it takes the row at 0.6 s.
        async with run_workflows(Session, workflows=[Hanging], lease=lease, poll_interval=looking):

            async def failed() -> bool:
                return (await fetch(Session, Hanging, 1)).last_error is not None

            began = time.monotonic()
            await wait_until(failed, timeout=5)
            took = time.monotonic() - began
    assert controls.began == ["a"], "one attempt: no worker took the row before its timeout"
    assert 1.3 < took < 2.5
    row = await fetch(Session, Hanging, 1)
    assert row.last_error is not None and "timeout of 1.5 s" in row.last_error
    assert (row.next_step, row.attempts, row.claimed_until) == (None, 1, None)
    assert [verdict for verdict, _, _ in await attempts(Session)] == ["failed"]


async def test_a_timeout_error_of_the_body_is_its_own(db: Database) -> None:
    Session = await db.create(controls.Base.metadata)
    async with connect_workflows(Session, workflows=[Hanging]):
        assert await Hanging(id=1).start(Hanging.provider_timeout)
    assert await drain(Session, [Hanging]) == 1
    row = await fetch(Session, Hanging, 1)
    assert row.last_error == "TimeoutError: provider answered nothing in 3 s"


async def test_a_body_that_swallows_its_cancellation_still_timed_out(db: Database) -> None:
    Session = await db.create(controls.Base.metadata)
    async with connect_workflows(Session, workflows=[Hanging]):
        assert await Hanging(id=1).start(Hanging.swallows_its_cancellation)
    assert await drain(Session, [Hanging]) == 1
    row = await fetch(Session, Hanging, 1)
    assert (row.next_step, row.attempts, row.note) == (None, 1, "")
    assert row.last_error is not None and row.last_error.startswith("StepTimeoutError: ")


async def test_a_timed_out_attempt_leaves_none_of_its_effects(db: Database) -> None:
    Session = await db.create(controls.Base.metadata)
    async with connect_workflows(Session, workflows=[Hanging]):
        assert await Hanging(id=1).start(Hanging.write_then_hang)
    assert await drain(Session, [Hanging]) == 1
    row = await fetch(Session, Hanging, 1)
    assert (row.next_step, row.attempts, row.claimed_until) == (None, 1, None)
    assert row.last_error is not None and row.last_error.startswith("StepTimeoutError: ")
    assert db.sql("SELECT count(*) FROM control_receipt") == [(0,)]
    [(open_transactions,)] = db.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND state LIKE 'idle in transaction%'"
    )
    assert open_transactions == 0


def test_bad_timeouts_are_refused() -> None:
    for wrong in (0, -1, 0.0, timedelta(0), timedelta(seconds=-3), float("nan"), float("inf")):
        with pytest.raises(ConfigurationError, match="timeout must be"):
            step(timeout=wrong)
    for wrong_type in ("30", True, [1]):
        with pytest.raises(ConfigurationError, match="a timedelta or a number of seconds"):
            step(timeout=wrong_type)  # type: ignore[arg-type]
    assert callable(step(timeout=2.5))  # seconds are accepted
