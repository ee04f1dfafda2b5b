"""Waiting for an event: every rule of waiting for an event, one test each."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from engine import StepError, connect_workflows, run_workflows
from engine.testing import move_clock
from functions import examples
from functions.examples import Expense
from tests.apps import events
from tests.apps.events import Chat
from tests.conftest import Database
from tests.helpers import fetch, wait_until


@pytest.fixture(autouse=True)
def fresh_controls() -> None:
    events.gate = asyncio.Event()
    events.then.clear()


async def settled(Session, row: Chat) -> Chat:  # type: ignore[no-untyped-def]
    """The row once no step is running or due on it."""

    async def idle() -> bool:
        stored = await fetch(Session, Chat, row.id)
        return stored.claimed_until is None and (
            stored.next_step is None or stored.waiting_for is not None
        )

    await wait_until(idle)
    return await fetch(Session, Chat, row.id)


async def status_is(Session: Any, expense_id: int, status: str) -> bool:
    """Whether the Expense run has reached `status`."""
    return (await fetch(Session, Expense, expense_id)).status == status


async def test_expense_example_is_approved_by_a_delivered_decision(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with run_workflows(Session, workflows=[Expense]):
        expense = Expense(amount=120)
        assert await expense.start(Expense.request_approval)

        await wait_until(lambda: status_is(Session, expense.id, "pending"))
        accepted = await Expense.by(Expense.id == expense.id).deliver(
            Expense.decide("approve", by="maria"), key="req-1"
        )
        assert accepted == 1

        await wait_until(lambda: status_is(Session, expense.id, "approve by maria"))
        assert (
            await Expense.by(Expense.id == expense.id).deliver(
                Expense.decide("reject", by="bob"), key="req-2"
            )
            == 0
        ), "a finished run refuses events"


async def test_expense_example_escalates_when_nobody_decides_in_two_days(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with run_workflows(Session, workflows=[Expense]):
        expense = Expense(amount=80)
        assert await expense.start(Expense.request_approval)

        await wait_until(lambda: status_is(Session, expense.id, "pending"))
        await move_clock(Session, timedelta(days=2, seconds=1))

        await wait_until(lambda: status_is(Session, expense.id, "escalated"))
        done = await fetch(Session, Expense, expense.id)
    assert (done.status, done.next_step, done.waiting_for) == ("escalated", None, None)


async def test_deliver_returns_how_many_runs_accepted(db: Database) -> None:
    Session = await db.create(events.Base.metadata)
    async with run_workflows(Session, workflows=[Chat]):
        rows = [Chat() for _ in range(3)]
        for row in rows:
            assert await row.start(Chat.open)
        for row in rows:
            await settled(Session, row)
        assert await Chat.by(Chat.id.in_([rows[0].id, rows[1].id])).deliver(Chat.message("hi")) == 2
        assert await Chat.by(Chat.id == 999).deliver(Chat.message("nobody")) == 0


async def test_an_event_that_arrives_before_the_wait_is_held_and_applied_when_it_arms(
    db: Database,
) -> None:
    Session = await db.create(events.Base.metadata)
    events.then.extend(["gate", "wait"])
    async with run_workflows(Session, workflows=[Chat]):
        row = Chat()
        assert await row.start(Chat.open)
        await wait_until(lambda: running(Session, row))
        assert await Chat.by(Chat.id == row.id).deliver(Chat.message("early")) == 1
        assert (await fetch(Session, Chat, row.id)).pending_event is not None
        events.gate.set()

        async def answered() -> bool:
            return (await fetch(Session, Chat, row.id)).transcript == "[early]"

        await wait_until(answered)
        stored = await settled(Session, row)
    assert stored.pending_event is None and stored.waiting_for == "message"


async def running(Session, row: Chat) -> bool:  # type: ignore[no-untyped-def]
    """Whether a worker holds the row (a step is running on it)."""
    return (await fetch(Session, Chat, row.id)).claimed_until is not None


async def test_a_run_holds_one_event_at_a_time(db: Database) -> None:
    Session = await db.create(events.Base.metadata)
    events.then.extend(["gate", "wait"])
    async with run_workflows(Session, workflows=[Chat]):
        row = Chat()
        assert await row.start(Chat.open)
        await wait_until(lambda: running(Session, row))
        handle = Chat.by(Chat.id == row.id)
        assert await handle.deliver(Chat.message("first")) == 1
        assert await handle.deliver(Chat.message("second")) == 0, "an answer given stays"
        events.gate.set()

        async def answered() -> bool:
            return (await fetch(Session, Chat, row.id)).transcript == "[first]"

        await wait_until(answered)
        stored = await settled(Session, row)
    assert stored.transcript == "[first]", "the second answer never ran"
    assert stored.waiting_for is not None, "it waits again, holding nothing"


@pytest.mark.parametrize("then", ["other", "stop", "schedule"])
async def test_a_held_event_is_discarded_when_the_run_waits_for_something_else_stops_or_goes_round_a_schedule(  # noqa: E501
    db: Database, then: str
) -> None:
    Session = await db.create(events.Base.metadata)
    events.then.extend(["gate", then])
    async with run_workflows(Session, workflows=[Chat]):
        row = Chat()
        assert await row.start(Chat.open)
        await wait_until(lambda: running(Session, row))
        assert await Chat.by(Chat.id == row.id).deliver(Chat.message("held"), key="k") == 1
        events.gate.set()

        async def step_done() -> bool:
            stored = await fetch(Session, Chat, row.id)
            return stored.claimed_until is None and stored.next_step != "message"

        await wait_until(step_done)
        await asyncio.sleep(0.1)
        stored = await fetch(Session, Chat, row.id)
    assert stored.pending_event is None and stored.transcript == ""
    if then == "other":
        # Its sender sends it again: the key was never taken, so it is accepted.
        async with connect_workflows(Session, workflows=[Chat]):
            handle = Chat.by(Chat.id == row.id)
            assert await handle.deliver(Chat.message("held"), key="k") == 0, "waits for other"
            assert await handle.deliver(Chat.other("x"), key="k") == 1


async def test_a_held_event_stops_counting_once_a_worker_takes_it(db: Database) -> None:
    Session = await db.create(events.Base.metadata)
    # open waits; "one" arrives and runs, and while it runs "two" arrives and is held.
    events.then.extend(["wait", "gate", "wait"])
    async with run_workflows(Session, workflows=[Chat]):
        row = Chat()
        assert await row.start(Chat.open)
        await settled(Session, row)
        handle = Chat.by(Chat.id == row.id)
        assert await handle.deliver(Chat.message("one")) == 1
        await wait_until(lambda: running(Session, row))
        assert await handle.deliver(Chat.message("two")) == 1, "held for the next wait"
        events.gate.set()

        async def both() -> bool:
            return (await fetch(Session, Chat, row.id)).transcript == "[one][two]"

        await wait_until(both)
        stored = await settled(Session, row)
    assert stored.transcript == "[one][two]", "the held event ran once, after the first"


async def test_a_key_makes_delivery_idempotent_and_is_taken_when_the_event_runs(
    db: Database,
) -> None:
    Session = await db.create(events.Base.metadata)
    async with run_workflows(Session, workflows=[Chat]):
        row = Chat()
        assert await row.start(Chat.open)
        await settled(Session, row)
        handle = Chat.by(Chat.id == row.id)
        assert await handle.deliver(Chat.message("a"), key="k1") == 1
        assert await handle.deliver(Chat.message("a"), key="k1") == 0, "accepted, not yet run"

        async def ran() -> bool:
            return (await settled(Session, row)).transcript == "[a]"

        await wait_until(ran)
        assert await handle.deliver(Chat.message("a"), key="k1") == 0, "already taken"
        for n in range(2, 18):
            assert await handle.deliver(Chat.message(str(n)), key=f"k{n}") == 1
            await wait_until(lambda n=n: _ends(Session, row, f"[{n}]"))
        stored = await fetch(Session, Chat, row.id)
        assert stored.recent_event_keys == [f"k{n}" for n in range(2, 18)], "the last sixteen"
        assert await handle.deliver(Chat.message("again"), key="k1") == 1, "k1 was forgotten"


async def _ends(Session, row: Chat, text: str) -> bool:  # type: ignore[no-untyped-def]
    stored = await fetch(Session, Chat, row.id)
    return stored.transcript.endswith(text) and stored.waiting_for is not None


async def test_arguments_are_checked_against_the_addressed_step_at_delivery(
    db: Database,
) -> None:
    Session = await db.create(events.Base.metadata)
    async with run_workflows(Session, workflows=[Chat]):
        row = Chat()
        assert await row.start(Chat.open)
        await settled(Session, row)
        handle = Chat.by(Chat.id == row.id)
        with pytest.raises(StepError, match=r"Chat\.message"):
            await handle.deliver(Chat.message())  # type: ignore[call-arg]
        with pytest.raises(StepError, match=r"Chat\.message"):
            await handle.deliver(Chat.message(text={1, 2}))  # type: ignore[arg-type]
        stored = await fetch(Session, Chat, row.id)
    assert stored.pending_event is None and stored.waiting_for == "message"


async def test_past_the_deadline_deliver_returns_0_even_before_the_timeout_step_ran(
    db: Database,
) -> None:
    Session = await db.create(events.Base.metadata)
    events.then.append("timeout")
    async with run_workflows(Session, workflows=[Chat]):
        row = Chat()
        assert await row.start(Chat.open)
        await settled(Session, row)
    # No worker now: nobody can reach the timeout step.
    await move_clock(Session, timedelta(hours=1, seconds=1))
    async with connect_workflows(Session, workflows=[Chat]):
        assert await Chat.by(Chat.id == row.id).deliver(Chat.message("late")) == 0
    async with run_workflows(Session, workflows=[Chat]):

        async def timed_out() -> bool:
            return (await fetch(Session, Chat, row.id)).timeouts == 1

        await wait_until(timed_out)
    assert (await fetch(Session, Chat, row.id)).transcript == ""


async def test_before_the_deadline_the_event_wins_and_the_timeout_does_not_run(
    db: Database,
) -> None:
    Session = await db.create(events.Base.metadata)
    events.then.extend(["timeout", "stop"])
    async with run_workflows(Session, workflows=[Chat]) as worker:
        row = Chat()
        assert await row.start(Chat.open)
        await settled(Session, row)
        await move_clock(Session, timedelta(minutes=59))
        assert await Chat.by(Chat.id == row.id).deliver(Chat.message("in time")) == 1

        async def answered() -> bool:
            return (await fetch(Session, Chat, row.id)).transcript == "[in time]"

        await wait_until(answered)
        await move_clock(Session, timedelta(hours=2))
        assert await worker.wake(5), "a look past the deadline found nothing to run"
        stored = await fetch(Session, Chat, row.id)
    assert stored.timeouts == 0 and stored.next_step is None


async def test_a_finished_run_refuses_events_unless_restart(db: Database) -> None:
    Session = await db.create(events.Base.metadata)
    events.then.append("stop")
    async with run_workflows(Session, workflows=[Chat]):
        row = Chat()
        assert await row.start(Chat.open)
        await settled(Session, row)
        handle = Chat.by(Chat.id == row.id)
        assert await handle.deliver(Chat.message("closed")) == 0
        events.then.append("stop")
        assert await handle.deliver(Chat.message("reopen"), restart=True) == 1

        async def answered() -> bool:
            return (await fetch(Session, Chat, row.id)).transcript == "[reopen]"

        await wait_until(answered)
        stored = await settled(Session, row)
    assert (stored.transcript, stored.next_step) == ("[reopen]", None), "restarted, then done"
