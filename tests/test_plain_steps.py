"""Plain `def` steps: run in a worker thread, with an async step's guarantees.

- a plain step changes its row (committed with the step) and returns the next step,
  from a thread other than the event loop's: test_a_plain_step_changes_its_row_and_goes_on
- one that raises is retried per its policy, its failed attempt's change dropped:
  test_a_plain_step_that_raises_is_retried
- one that blocks past its timeout fails; its thread's late result is discarded:
  test_a_plain_step_past_its_timeout_fails_and_its_late_result_is_dropped
- while one blocks, an async step of another run starts and finishes:
  test_a_blocking_plain_step_does_not_block_the_event_loop
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from engine import connect_workflows, run_workflows
from engine.testing import drain, move_clock
from tests.apps import controls
from tests.apps.controls import Plain
from tests.conftest import Database
from tests.helpers import fetch, wait_until


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """The gate plain steps block on, opened at the test's end so no thread outlives it."""
    controls.gate.clear()
    controls.late.clear()
    yield controls.gate
    controls.gate.set()


async def test_a_plain_step_changes_its_row_and_goes_on(db: Database) -> None:
    Session = await db.create(controls.Base.metadata)
    async with connect_workflows(Session, workflows=[Plain]):
        assert await Plain(id=1).start(Plain.tally(3))
    assert await drain(Session, [Plain]) == 1  # tally, then finish on the same lease
    row = await fetch(Session, Plain, 1)
    assert (row.count, row.note, row.next_step, row.attempts) == (3, "tallied", None, 0)
    assert row.thread and row.thread != threading.main_thread().name


async def test_a_plain_step_that_raises_is_retried(db: Database) -> None:
    controls.raise_next[:] = [ConnectionError("disk busy")]
    Session = await db.create(controls.Base.metadata)
    async with connect_workflows(Session, workflows=[Plain]):
        assert await Plain(id=1).start(Plain.flaky)
    assert await drain(Session, [Plain]) == 1
    row = await fetch(Session, Plain, 1)
    assert (row.next_step, row.attempts, row.count) == ("flaky", 1, 0)
    assert row.last_error == "ConnectionError: disk busy"
    await move_clock(Session, controls.QUICK)
    assert await drain(Session, [Plain]) == 1
    row = await fetch(Session, Plain, 1)
    assert (row.next_step, row.attempts, row.count, row.last_error) == (None, 0, 1, None)


async def test_a_plain_step_past_its_timeout_fails_and_its_late_result_is_dropped(
    db: Database, gate: threading.Event
) -> None:
    Session = await db.create(controls.Base.metadata)
    async with connect_workflows(Session, workflows=[Plain]):
        assert await Plain(id=1).start(Plain.blocks)
    began = time.monotonic()
    assert await drain(Session, [Plain]) == 1
    assert 0.2 <= time.monotonic() - began < 1.0, "the attempt ended at its timeout"
    row = await fetch(Session, Plain, 1)
    assert (row.next_step, row.attempts, row.note, row.claimed_until) == (None, 1, "", None)
    assert row.last_error == (
        "StepTimeoutError: Step Plain.blocks did not finish within its timeout of 0.2 s; "
        "the attempt was cancelled."
    )
    assert controls.late == [], "the thread still blocks"
    gate.set()
    await wait_until(lambda: controls.late == ["blocks"], timeout=5, what="the thread's return")
    assert (await fetch(Session, Plain, 1)).note == "", "what the thread did late is not written"


async def test_a_blocking_plain_step_does_not_block_the_event_loop(
    db: Database, gate: threading.Event
) -> None:
    Session = await db.create(controls.Base.metadata)
    async with run_workflows(Session, workflows=[Plain]):
        assert await Plain(id=1).start(Plain.waits_for_gate)

        async def blocking() -> bool:
            return (await fetch(Session, Plain, 1)).claimed_until is not None

        await wait_until(blocking, what="the plain step's claim")
        assert await Plain(id=2).start(Plain.quick)

        async def quick_done() -> bool:
            return (await fetch(Session, Plain, 2)).note == "quick"

        await wait_until(quick_done, timeout=3, what="the async step, beside a blocked thread")
        assert (await fetch(Session, Plain, 1)).next_step == "waits_for_gate", "still blocked"
        gate.set()

        async def through() -> bool:
            return (await fetch(Session, Plain, 1)).note == "through the gate"

        await wait_until(through, timeout=3, what="the plain step, once its gate opened")
    assert (await fetch(Session, Plain, 1)).next_step is None
